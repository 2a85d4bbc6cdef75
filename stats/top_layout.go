package stats

// The text layout of Top's frames: aligned columns, clipping to the
// screen, rates and sparklines.

import (
	"math"
	"strings"
	"unicode/utf8"
)

func rateText(r float64, bytes bool) string {
	if math.IsNaN(r) {
		return "-"
	}
	return FormatRate(r, bytes)
}

// table aligns cells in columns two spaces apart; align has 'l' or 'r' per
// column.
func table(cells [][]string, align string) []string {
	var width []int
	for _, row := range cells {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	out := make([]string, 0, len(cells))
	for _, row := range cells {
		var b strings.Builder
		for i, c := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i < len(align) && align[i] == 'r' {
				b.WriteString(pad + c)
			} else {
				b.WriteString(c + pad)
			}
		}
		out = append(out, strings.TrimRight(b.String(), " "))
	}
	return out
}

// clip keeps the first rows lines, each cut to cols characters.
func clip(lines []string, rows, cols int) []string {
	if rows > 0 && len(lines) > rows {
		lines = lines[:rows]
	}
	for i, l := range lines {
		if cols > 0 && utf8.RuneCountInString(l) > cols {
			lines[i] = string([]rune(l)[:cols])
		}
	}
	return lines
}

// sparkBlocks are the eight heights of a sparkline.
var sparkBlocks = []rune("▁▂▃▄▅▆▇█")

// Sparkline draws the last width values (non-negative) as block
// characters scaled to the largest of them; fewer values than width give
// a shorter line, none an empty one. All zeros are drawn as the lowest
// block.
func Sparkline(values []float64, width int) string {
	if width <= 0 || len(values) == 0 {
		return ""
	}
	if len(values) > width {
		values = values[len(values)-width:]
	}
	top := 0.0
	for _, v := range values {
		top = max(top, v)
	}
	var b strings.Builder
	for _, v := range values {
		i := 0
		if top > 0 && v > 0 {
			i = int(math.Ceil(v/top*float64(len(sparkBlocks)))) - 1
			i = min(max(i, 0), len(sparkBlocks)-1)
		}
		b.WriteRune(sparkBlocks[i])
	}
	return b.String()
}
