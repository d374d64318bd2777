package chat

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// strftime formats t like Python's datetime.strftime in the C locale, for the
// directives chat templates use. An unsupported directive is an error rather
// than text that silently differs from Python's.
func strftime(t time.Time, format string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(format) {
			return "", fmt.Errorf("strftime_now: format %q ends with a lone %%", format)
		}
		switch format[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'd':
			pad2(&b, t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			pad2(&b, int(t.Month()))
		case 'y':
			pad2(&b, t.Year()%100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			pad2(&b, t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			pad2(&b, h)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			pad2(&b, t.Minute())
		case 'S':
			pad2(&b, t.Second())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("strftime_now: directive %%%c in %q is not supported", format[i], format)
		}
	}
	return b.String(), nil
}

func pad2(b *strings.Builder, n int) {
	if n < 10 {
		b.WriteByte('0')
	}
	b.WriteString(strconv.Itoa(n))
}
