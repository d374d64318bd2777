package shard

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progressBar draws one line, redrawn in place, on a terminal:
//
//	weights layers 0-4 +embed [=========>          ]  48%  12.0/25.0 MiB  31.2 MiB/s
//
// It is hand-written rather than github.com/schollz/progressbar: the
// shard needs a single byte counter, and this keeps the dependency graph
// (and its terminal handling) out of every shard binary. A nil bar, or one
// with a nil writer, draws nothing.
type progressBar struct {
	w     io.Writer
	label string
	total int64
	done  int64
	start time.Time
	drawn time.Time
	now   func() time.Time
}

// redrawEvery bounds redraws: a terminal line 10 times a second is smooth
// and costs nothing next to the stream.
const redrawEvery = 100 * time.Millisecond

func newProgressBar(w io.Writer, label string, total int64) *progressBar {
	if w == nil {
		return nil
	}
	b := &progressBar{w: w, label: label, total: total, now: time.Now}
	b.start = b.now()
	b.draw()
	return b
}

// add counts n more bytes and redraws when redrawEvery has passed.
func (b *progressBar) add(n int64) {
	if b == nil {
		return
	}
	b.done += n
	if b.now().Sub(b.drawn) >= redrawEvery {
		b.draw()
	}
}

// finish draws the final state and ends the line.
func (b *progressBar) finish() {
	if b == nil {
		return
	}
	b.draw()
	fmt.Fprintln(b.w)
}

// abort ends the line as it stands.
func (b *progressBar) abort() {
	if b == nil {
		return
	}
	fmt.Fprintln(b.w, " (failed)")
}

func (b *progressBar) draw() {
	b.drawn = b.now()
	const width = 30
	frac := 1.0
	if b.total > 0 {
		frac = min(1, float64(b.done)/float64(b.total))
	}
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	secs := b.drawn.Sub(b.start).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(b.done) / (1 << 20) / secs
	}
	fmt.Fprintf(b.w, "\r%s [%s] %3.0f%% %7.1f/%.1f MiB %6.1f MiB/s", b.label, bar, 100*frac,
		float64(b.done)/(1<<20), float64(b.total)/(1<<20), rate)
}

// terminalStderr returns os.Stderr when it is a terminal (the bar is for a
// person watching), nil otherwise (a log file, journald, docker logs).
func terminalStderr() io.Writer {
	if isTerminal(os.Stderr.Fd()) {
		return os.Stderr
	}
	return nil
}
