package v1

import "testing"

func TestParseChangeNetwork(t *testing.T) {
	tests := []struct {
		value   string
		want    ChangeNetwork
		wantErr bool
	}{
		{value: "isolate", want: ChangeNetwork{Action: ChangeNetworkIsolate}},
		{value: "global", want: ChangeNetwork{Action: ChangeNetworkGlobal}},
		{value: "join:team-b", want: ChangeNetwork{Action: ChangeNetworkJoin, Target: "team-b"}},
		{value: "join:", wantErr: true},
		{value: "join:Team_B", wantErr: true},
		{value: "join", wantErr: true},
		{value: "Isolate", wantErr: true},
		{value: "", wantErr: true},
		{value: "global ", wantErr: true},
		{value: "merge:a", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := ParseChangeNetwork(tt.value)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseChangeNetwork(%q) error = %v, wantErr %v", tt.value, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got != tt.want {
				t.Fatalf("ParseChangeNetwork(%q) = %+v, want %+v", tt.value, got, tt.want)
			}
			if got.String() != tt.value {
				t.Fatalf("String() = %q, want the annotation value %q back", got.String(), tt.value)
			}
		})
	}
}

func FuzzParseChangeNetwork(f *testing.F) {
	for _, s := range []string{"isolate", "global", "join:a", "join:", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		c, err := ParseChangeNetwork(value)
		if err != nil {
			return
		}
		// Whatever parses must print back to the same value, so flowctl and the controller agree.
		if c.String() != value {
			t.Fatalf("ParseChangeNetwork(%q).String() = %q", value, c.String())
		}
	})
}
