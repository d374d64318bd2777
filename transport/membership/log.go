package membership

import (
	"bytes"
	"context"
	"log/slog"
)

// logWriter turns memberlist's log lines ("[WARN] memberlist: text") into
// slog records at the matching level. memberlist's [ERR] lines are
// transient troubles it recovers from (a failed probe, a refused push/pull),
// so they become warnings; errors are for whoever handles them.
type logWriter struct {
	logger *slog.Logger
}

// Write logs one line; the standard log package calls it once per line.
func (w logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimRight(p, "\n")
	level := slog.LevelInfo
	for _, l := range []struct {
		prefix string
		level  slog.Level
	}{
		{"[DEBUG]", slog.LevelDebug},
		{"[INFO]", slog.LevelInfo},
		{"[WARN]", slog.LevelWarn},
		{"[ERR]", slog.LevelWarn},
		{"[ERROR]", slog.LevelWarn},
	} {
		if rest, ok := bytes.CutPrefix(line, []byte(l.prefix)); ok {
			level, line = l.level, bytes.TrimSpace(rest)
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.logger.Log(context.Background(), level, string(line))
	return len(p), nil
}
