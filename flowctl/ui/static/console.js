// ofsdn console: the little the pages need a script for. Everything works without it except live
// updates: a page whose main element has data-refresh reloads its content every so many seconds
// (pausable, and paused while the tab is hidden); the drops page follows the drop stream; the trace
// form says it is tracing while it waits.
(function () {
  'use strict';
  var main = document.querySelector('main[data-refresh]');
  var status = document.getElementById('live-status');

  function say(text) { if (status) status.textContent = text; }
  function clock() { return new Date().toLocaleTimeString(); }

  if (main && status) {
    var every = parseInt(main.getAttribute('data-refresh'), 10) * 1000;
    var paused = false;
    var busy = false;
    var button = document.createElement('button');
    button.type = 'button';
    button.className = 'secondary';
    button.setAttribute('aria-pressed', 'false');
    button.textContent = 'Pause live updates';
    button.addEventListener('click', function () {
      paused = !paused;
      button.setAttribute('aria-pressed', paused ? 'true' : 'false');
      button.textContent = paused ? 'Resume live updates' : 'Pause live updates';
      say(paused ? 'live updates paused' : 'live: every ' + every / 1000 + ' s');
    });
    status.parentNode.appendChild(button);
    say('live: every ' + every / 1000 + ' s');

    var refresh = function () {
      if (paused || busy || document.hidden) return;
      busy = true;
      fetch(window.location.href, {headers: {'Accept': 'text/html'}, cache: 'no-store'})
        .then(function (r) {
          if (!r.ok && r.status !== 404) throw new Error('HTTP ' + r.status);
          return r.text();
        })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, 'text/html');
          var fresh = doc.getElementById('content');
          var here = document.getElementById('content');
          if (fresh && here) here.replaceWith(fresh);
          say('live: updated ' + clock());
        })
        .catch(function (e) { say('live: update failed at ' + clock() + ' (' + e.message + '); showing the last good page'); })
        .then(function () { busy = false; });
    };
    window.setInterval(refresh, every);
    document.addEventListener('visibilitychange', function () { if (!document.hidden) refresh(); });
  }

  // The drop stream: new drops go on top of the table.
  var drops = document.querySelector('[data-drops-stream]');
  if (drops && window.EventSource) {
    var body = drops.querySelector('tbody');
    var dropStatus = document.getElementById('drops-status');
    var src = new EventSource(drops.getAttribute('data-drops-stream'));
    var cell = function (tr, text, cls) {
      var td = document.createElement('td');
      td.textContent = text;
      if (cls) td.className = cls;
      tr.appendChild(td);
    };
    src.addEventListener('open', function () { if (dropStatus) dropStatus.textContent = 'following new drops'; });
    src.addEventListener('drop', function (ev) {
      var d = JSON.parse(ev.data);
      var tr = document.createElement('tr');
      cell(tr, new Date(d.time).toISOString().substr(11, 8), 'mono'); // UTC, as the server writes it
      cell(tr, d.node);
      cell(tr, d.src, 'mono');
      cell(tr, d.dst, 'mono');
      cell(tr, d.proto + (d.port ? '/' + d.port : ''), 'mono');
      cell(tr, d.verdict);
      cell(tr, d.object || '');
      cell(tr, d.table || '', 'mono');
      var empty = body.querySelector('.empty');
      if (empty) empty.remove();
      body.insertBefore(tr, body.firstChild);
      while (body.children.length > 500) body.removeChild(body.lastChild);
    });
    src.addEventListener('failed', function (ev) {
      if (dropStatus) dropStatus.textContent = 'the stream stopped: ' + JSON.parse(ev.data);
      src.close();
    });
    src.addEventListener('error', function () {
      if (dropStatus) dropStatus.textContent = 'the stream is interrupted; reconnecting';
    });
  }

  // The trace form: a trace can take seconds; say so.
  var form = document.getElementById('trace-form');
  if (form) {
    form.addEventListener('submit', function () {
      var b = form.querySelector('button[type=submit]');
      if (b) { b.disabled = true; b.textContent = 'Tracing…'; }
      var s = document.getElementById('trace-status');
      if (s) s.textContent = 'Tracing: asking each node on the way…';
    });
  }
})();
