package stats

import (
	"math/rand/v2"
	"testing"
)

func TestBinomialInterval(t *testing.T) {
	// Known values: Binomial(100, 0.5) has P(X ≤ 39) ≈ 0.0176 and P(X ≤ 40) ≈ 0.0284, so at alpha 0.05
	// the lower bound is 40; symmetric above.
	if lo, hi := BinomialInterval(100, 0.5, 0.05); lo != 40 || hi != 60 {
		t.Errorf("Binomial(100, .5) at 5%%: [%d, %d], want [40, 60]", lo, hi)
	}
	if lo, hi := BinomialInterval(10, 0.5, 0.5); lo != 4 || hi != 6 {
		t.Errorf("Binomial(10, .5) at 50%%: [%d, %d], want [4, 6]", lo, hi)
	}
	if lo, hi := BinomialInterval(0, 0.5, 0.05); lo != 0 || hi != 0 {
		t.Errorf("no draws: [%d, %d]", lo, hi)
	}
}

// TestSpreadCatchesSkew: a uniform spread passes (its false-alarm rate stays near alpha over many
// seeded runs), and a skewed one (one category twice as likely) fails.
func TestSpreadCatchesSkew(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	draw := func(weights []float64, n int) map[string]int {
		sum := 0.0
		for _, w := range weights {
			sum += w
		}
		out := map[string]int{}
		for range n {
			x := rng.Float64() * sum
			for i, w := range weights {
				if x < w || i == len(weights)-1 {
					out[string(rune('a'+i))]++
					break
				}
				x -= w
			}
		}
		return out
	}
	alarms := 0
	for range 2000 {
		if _, err := Spread(draw([]float64{1, 1, 1, 1}, 200), 4, 0.01); err != nil {
			alarms++
		}
	}
	if alarms > 50 { // expected at most 20 (1%): more means the bounds are too tight
		t.Errorf("uniform spreads failed %d times in 2000 at alpha 1%%", alarms)
	}
	if _, err := Spread(draw([]float64{2, 1, 1, 1}, 400), 4, 0.001); err == nil {
		t.Error("a category twice as likely passed")
	}
	if _, err := Spread(map[string]int{"a": 100}, 4, 0.001); err == nil {
		t.Error("everything in one category passed")
	}
}
