// The accessibility basics, checked in the page as a person's browser renders it (see browser.go:
// why this and not axe-core). It returns {violations, checked, incomplete}: each violation names its
// rule, the element and what is wrong. Rules, after WCAG 2.2 level A/AA and axe-core's rule names:
//   html-lang, document-title, landmark-main, page-has-heading-one, duplicate-id,
//   image-alt, svg-img-alt, label (form controls), button-name, link-name, table-headers,
//   color-contrast (4.5:1, 3:1 for large text: 24px, or 18.66px bold; text, inputs, placeholders).
(() => {
  const violations = [];
  const incomplete = [];
  let checked = 0;
  const describe = (el) => {
    if (!el) return '';
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    else if (typeof el.className === 'string' && el.className.trim()) s += '.' + el.className.trim().split(/\s+/).join('.');
    const t = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 50);
    return t ? s + ' "' + t + '"' : s;
  };
  const add = (rule, el, detail) => violations.push({rule: rule, element: describe(el), detail: detail});
  const shown = (el) => {
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const st = getComputedStyle(e);
      if (st.display === 'none' || st.visibility === 'hidden' || e.getAttribute('aria-hidden') === 'true') return false;
    }
    return el.getClientRects().length > 0;
  };
  const textOf = (el) => (el.innerText || el.textContent || '').trim();
  const labelledBy = (el) => (el.getAttribute('aria-labelledby') || '').split(/\s+/).filter(Boolean)
    .map((id) => document.getElementById(id)).filter(Boolean).map(textOf).join(' ').trim();
  const nameOf = (el) => {
    const a = (el.getAttribute('aria-label') || '').trim();
    if (a) return a;
    const lb = labelledBy(el);
    if (lb) return lb;
    if (el.labels) for (const l of el.labels) { const t = textOf(l); if (t) return t; }
    return '';
  };

  // The document.
  if (!(document.documentElement.getAttribute('lang') || '').trim()) add('html-lang', document.documentElement, 'the page declares no language (html lang)');
  if (!document.title.trim()) add('document-title', null, 'the page has no title');
  const mains = document.querySelectorAll('main, [role=main]').length;
  if (mains !== 1) add('landmark-main', null, 'want exactly one main landmark, have ' + mains);
  if (document.querySelectorAll('h1').length < 1) add('page-has-heading-one', null, 'the page has no h1');
  const ids = {};
  for (const el of document.querySelectorAll('[id]')) {
    if (ids[el.id]) add('duplicate-id', el, 'id "' + el.id + '" is used more than once');
    ids[el.id] = true;
  }

  // Images and names.
  // Only what is rendered: a hidden element is not in the accessibility tree.
  for (const img of document.querySelectorAll('img')) {
    if (shown(img) && !img.hasAttribute('alt')) add('image-alt', img, 'img without an alt attribute (alt="" for decoration)');
  }
  for (const svg of document.querySelectorAll('svg')) {
    if (!shown(svg) || (svg.parentElement && svg.parentElement.closest('svg'))) continue;
    const named = svg.getAttribute('role') === 'img' && (nameOf(svg) || svg.querySelector('title'));
    if (!named) add('svg-img-alt', svg, 'svg neither hidden (aria-hidden="true") nor role="img" with a name');
  }
  for (const el of document.querySelectorAll('input, select, textarea')) {
    const type = (el.getAttribute('type') || 'text').toLowerCase();
    if (type === 'hidden' || !shown(el)) continue;
    if (type === 'image') { if (!(el.getAttribute('alt') || '').trim()) add('image-alt', el, 'image button without alt'); continue; }
    if (type === 'submit' || type === 'button' || type === 'reset') {
      if (!((el.value || '').trim() || nameOf(el))) add('button-name', el, 'input button without a name');
      continue;
    }
    if (!nameOf(el)) add('label', el, 'form control without a label (label for=, a wrapping label, aria-label or aria-labelledby)');
  }
  for (const el of document.querySelectorAll('button, [role=button]')) {
    if (shown(el) && !(nameOf(el) || textOf(el))) add('button-name', el, 'button without a name');
  }
  for (const el of document.querySelectorAll('a[href]')) {
    if (shown(el) && !(nameOf(el) || textOf(el) || el.querySelector('img[alt]:not([alt=""])'))) add('link-name', el, 'link without a name');
  }
  for (const t of document.querySelectorAll('table')) {
    if (t.getAttribute('role') === 'presentation' || !shown(t)) continue;
    if (!t.querySelector('th')) add('table-headers', t, 'data table without header cells (th)');
  }

  // Contrast.
  const parse = (c) => {
    const m = /^rgba?\(([^)]*)\)$/.exec(c.trim());
    if (!m) return null;
    const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
    if (p.length < 3 || p.some(isNaN)) return null;
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const over = (top, bottom) => ({
    r: top.r * top.a + bottom.r * (1 - top.a),
    g: top.g * top.a + bottom.g * (1 - top.a),
    b: top.b * top.a + bottom.b * (1 - top.a), a: 1});
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  // background is the colour behind el: its own and its ancestors' backgrounds laid over a white canvas
  // (null where an image or gradient makes it unknowable).
  const background = (el) => {
    const chain = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (let i = chain.length - 1; i >= 0; i--) {
      const st = getComputedStyle(chain[i]);
      if (st.backgroundImage && st.backgroundImage !== 'none') return null;
      const c = parse(st.backgroundColor);
      if (c && c.a > 0) bg = over(c, bg);
    }
    return bg;
  };
  const checkColor = (el, st, what) => {
    if (el.disabled) return;
    const fg = parse(st.color), bg = background(el);
    if (!fg || !bg) { incomplete.push(describe(el) + ': ' + what + ' colour unknown (' + st.color + ')'); return; }
    const size = parseFloat(st.fontSize), bold = parseInt(st.fontWeight, 10) >= 700;
    const need = size >= 24 || (size >= 18.66 && bold) ? 3 : 4.5;
    const r = ratio(over(fg, bg), bg);
    checked++;
    if (r + 1e-6 < need) {
      const hex = (c) => '#' + [c.r, c.g, c.b].map((v) => Math.round(v).toString(16).padStart(2, '0')).join('');
      add('color-contrast', el, what + ' contrast ' + r.toFixed(2) + ':1 (' + hex(over(fg, bg)) + ' on ' + hex(bg) + '), need ' + need + ':1');
    }
  };
  for (const el of document.body.querySelectorAll('*')) {
    if (['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'svg'].includes(el.tagName) || !shown(el)) continue;
    const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
    const field = el.matches('input:not([type=hidden]):not([type=checkbox]):not([type=radio]), select, textarea');
    if (own || (field && (el.value || '').trim())) checkColor(el, getComputedStyle(el), 'text');
    if (field && el.getAttribute('placeholder') && !el.value) checkColor(el, getComputedStyle(el, '::placeholder'), 'placeholder');
  }
  return {violations: violations, checked: checked, incomplete: incomplete};
})()
