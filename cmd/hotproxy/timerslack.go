package main

import (
	"runtime"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/timerslack"
)

// applyTimerSlack gives every thread of this generation server.timer_slack
// (internal/timerslack says why). Where it cannot (another thread's needs
// root or CAP_SYS_NICE, unless the process was started with it) the
// generation serves on with the kernel's slack, and says so once.
func applyTimerSlack(log hclog.Logger, cfg *config.Config) {
	if runtime.GOOS != "linux" {
		return
	}
	slack := cfg.Server.TimerSlack.D()
	res, err := timerslack.Set(slack)
	if err != nil {
		log.Info("server.timer_slack is not on every thread: the Go runtime's sysmon may wake more often and cost some CPU",
			"timer_slack", slack, "threads", res.Threads, "unset", res.Unset, "error", err,
			"hint", "run as root or with CAP_SYS_NICE, or start it with the slack set: hotproxy supervise does, as does systemd's TimerSlackNSec=")
		return
	}
	log.Debug("timer slack set", "timer_slack", slack, "threads", res.Threads)
}
