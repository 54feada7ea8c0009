package rt

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/gouct/gouct/uct"
)

func TestLoggerLevel(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	for _, tc := range []struct {
		level string
		want  []string // of debug, info, warn, error
	}{
		{"", []string{"warn", "error"}},
		{"warn", []string{"warn", "error"}},
		{"INFO", []string{"info", "warn", "error"}},
		{"debug", []string{"debug", "info", "warn", "error"}},
		{"error", []string{"error"}},
		{"off", nil},
		{"bogus", []string{"warn", "error"}},
	} {
		buf.Reset()
		l := Logger(&uct.Config{LogLevel: tc.level}).With("k", "v")
		l.Debug("m-debug")
		l.Info("m-info")
		l.Warn("m-warn")
		l.Error("m-error")
		for _, lv := range []string{"debug", "info", "warn", "error"} {
			got := strings.Contains(buf.String(), "m-"+lv)
			want := strings.Contains(strings.Join(tc.want, ","), lv)
			if got != want {
				t.Errorf("level %q: %s logged = %v, want %v:\n%s", tc.level, lv, got, want, buf.String())
			}
		}
		if len(tc.want) > 0 && !strings.Contains(buf.String(), "k=v") {
			t.Errorf("level %q: attributes lost: %s", tc.level, buf.String())
		}
	}
}
