// Package stats holds the few statistics tests use to judge a spread: the exact binomial interval a
// count must fall in, and the chi-square statistic of counts against a uniform spread. Expected
// results come from these models, never from the code under test.
package stats

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// BinomialInterval returns [lo, hi] such that a Binomial(n, p) count falls below lo with probability at
// most alpha/2 and above hi with probability at most alpha/2 (exact tails, not a normal approximation).
func BinomialInterval(n int, p, alpha float64) (lo, hi int) {
	if n <= 0 {
		return 0, 0
	}
	pmf := make([]float64, n+1)
	for k := 0; k <= n; k++ {
		pmf[k] = math.Exp(logChoose(n, k) + logPow(p, k) + logPow(1-p, n-k))
	}
	tail := 0.0
	for lo = 0; lo <= n && tail+pmf[lo] <= alpha/2; lo++ {
		tail += pmf[lo]
	}
	tail = 0
	for hi = n; hi >= 0 && tail+pmf[hi] <= alpha/2; hi-- {
		tail += pmf[hi]
	}
	return lo, hi
}

func logChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// logPow is k·log(p), with 0^0 = 1.
func logPow(p float64, k int) float64 {
	if k == 0 {
		return 0
	}
	return float64(k) * math.Log(p)
}

// ChiSquare is Pearson's statistic of counts against a uniform spread over len(counts) categories.
func ChiSquare(counts []int) float64 {
	total := 0
	for _, c := range counts {
		total += c
	}
	if len(counts) == 0 || total == 0 {
		return 0
	}
	want := float64(total) / float64(len(counts))
	x := 0.0
	for _, c := range counts {
		x += (float64(c) - want) * (float64(c) - want) / want
	}
	return x
}

// ChiSquareQuantile approximates the quantile of chi-square with k degrees of freedom at the standard
// normal quantile z (Wilson-Hilferty; z = 3.09 for 99.9%, 3.72 for 99.99%).
func ChiSquareQuantile(k int, z float64) float64 {
	if k < 1 {
		return 0
	}
	a := 2 / (9 * float64(k))
	c := 1 - a + z*math.Sqrt(a)
	return float64(k) * c * c * c
}

// Spread checks that counts (per category, over categories categories) look like total draws of a
// uniform choice: every category's count inside the binomial interval at alpha split over the
// categories (Bonferroni), so a correct spread fails with probability at most alpha. It returns a line
// of figures for the log and, when a count is outside, an error naming it. Categories absent from
// counts count as zero.
func Spread(counts map[string]int, categories int, alpha float64) (string, error) {
	total := 0
	keys := make([]string, 0, len(counts))
	for k, c := range counts {
		total += c
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lo, hi := BinomialInterval(total, 1/float64(categories), alpha/float64(categories))
	all := make([]int, 0, categories)
	var bad []string
	maxDev := 0.0
	for _, k := range keys {
		c := counts[k]
		all = append(all, c)
		maxDev = max(maxDev, math.Abs(float64(c)-float64(total)/float64(categories)))
		if c < lo || c > hi {
			bad = append(bad, fmt.Sprintf("%s: %d", k, c))
		}
	}
	for len(all) < categories {
		all = append(all, 0)
		maxDev = float64(total) / float64(categories)
		if lo > 0 {
			bad = append(bad, "an unchosen category: 0")
		}
	}
	line := fmt.Sprintf("%d draws over %d: %v; each must be in [%d, %d] (binomial, %.2g overall); max deviation %.1f; chi-square %.2f (99.9%% quantile %.2f)",
		total, categories, counts, lo, hi, alpha, maxDev, ChiSquare(all), ChiSquareQuantile(categories-1, 3.09))
	if len(bad) > 0 || len(counts) > categories {
		return line, fmt.Errorf("not a uniform spread: %s; %s", strings.Join(bad, ", "), line)
	}
	return line, nil
}
