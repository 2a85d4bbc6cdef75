package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"text/tabwriter"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart/supervisor"
	"github.com/hotproxy/hotproxy/server"
)

// superviseCmd runs `hotproxy supervise`.
func superviseCmd(args []string, stderr io.Writer) int {
	fs := newFlags("supervise [-c FILE] [flags]",
		"Runs the generations of the proxy as its children: starts epoch 0, and on\n"+
			"SIGHUP or `hotproxy reload` starts the next epoch from the binary on disk,\n"+
			"which takes over the listening sockets; a new generation that fails leaves\n"+
			"the serving one untouched. SIGTERM/SIGINT stop every generation within\n"+
			"server.parent_shutdown_time; SIGUSR1 reopens [log] path and is forwarded; SIGUSR2\n"+
			"is forwarded (the generations re-read their TLS certificates). Speaks the systemd notify\n"+
			"protocol when NOTIFY_SOCKET is set, and is safe as PID 1.", stderr)
	cfgPath := fs.String("c", "", "config `file` (TOML); empty: the embedded default")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	baseID := fs.Int("base-id", defaultBaseID(), "base `id`: names the restart sockets, the stats region and the control socket; default $HOTPROXY_BASE_ID if set, else 0")
	ctlPath := fs.String("control-socket", "", "control socket `path` (default hotproxy.<base-id>.sock in the first of\n$RUNTIME_DIRECTORY, /run/hotproxy, $XDG_RUNTIME_DIR, $TMPDIR/hotproxy-<uid>\nthat this user may use, in a directory of this user nobody else may write;\n\"-\": none)")
	genBinary := fs.String("generation-binary", "", "`path` of the binary each generation runs (default: this executable's path,\nre-read at each start so that a replaced binary is picked up)")
	takeOver := fs.Bool("take-over", false, "start the first generation as the successor of a running generation of this\nbase-id that another supervisor started (e.g. in another container of the pod);\ncold start when none runs")
	watchConfig := fs.Duration("watch-config", 0, "reload when the content of -c's file changes, checked every `interval` (e.g. 2s):\na Kubernetes ConfigMap volume, an edited file; once per change, a config that\nfails is not retried until it changes again. 0: only on SIGHUP or `hotproxy reload`")
	logLevel := fs.String("log-level", "", "log `level` of the supervisor and its generations (overrides [log] level)")
	logFormat := fs.String("log-format", "", "log `format`: text or json (overrides [log] format)")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if *watchConfig != 0 && (*cfgPath == "" || *watchConfig < supervisor.MinWatchConfig) {
		fmt.Fprintf(stderr, "hotproxy supervise: --watch-config %v: needs -c FILE (the embedded default never changes) and an interval of at least %v\n", *watchConfig, supervisor.MinWatchConfig)
		return exitUsage
	}

	level, format := config.DefaultLogLevel, config.DefaultLogFormat
	cfg, err := config.Load(*cfgPath)
	if err == nil {
		level, format = cfg.Log.Level, cfg.Log.Format
	} else if _, resuming := os.LookupEnv(supervisor.EnvState); !resuming {
		fmt.Fprintf(stderr, "hotproxy supervise: %v\n", err)
		return 1
	}
	var extra []string
	if *logLevel != "" {
		level = *logLevel
		extra = append(extra, "--log-level", *logLevel)
	}
	if *logFormat != "" {
		format = *logFormat
		extra = append(extra, "--log-format", *logFormat)
	}
	logOut, logFile, err := openProcessLog(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy supervise: %v\n", err)
		return 1
	}
	var reopener supervisor.LogReopener
	if logFile != nil {
		defer logFile.Close()
		reopener = logFile
	}
	log, err := server.NewLogger(logOut, level, format)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy supervise: %v\n", err)
		return exitUsage
	}
	sup, err := supervisor.New(supervisor.Options{
		ConfigPath:    *cfgPath,
		BaseID:        *baseID,
		Binary:        *genBinary,
		ExtraArgs:     extra,
		ControlSocket: *ctlPath,
		ReapOrphans:   true,
		TakeOver:      *takeOver,
		WatchConfig:   *watchConfig,
		Logger:        log,
		LogFile:       reopener,
	})
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy supervise: %v\n", err)
		return 1
	}
	if err := sup.Run(context.Background()); err != nil {
		// Once on stderr; in the log too only when the log is a file.
		if logFile != nil {
			log.Error("supervisor stopped", "error", err)
		}
		fmt.Fprintf(stderr, "hotproxy supervise: %v\n", err)
		return 1
	}
	return 0
}

// controlFlags adds the flags that find a supervisor's control socket.
func controlFlags(fs interface {
	String(name, value, usage string) *string
	Int(name string, value int, usage string) *int
	Duration(name string, value time.Duration, usage string) *time.Duration
}) func() (string, error) {
	path := fs.String("control-socket", "", "control socket `path` (default: found where `hotproxy supervise` puts it for --base-id;\nrefused in a directory another user owns or may write, or served by another uid)")
	baseID := fs.Int("base-id", defaultBaseID(), "base `id` of the supervisor; default $HOTPROXY_BASE_ID if set, else 0")
	return func() (string, error) {
		if *path != "" {
			return *path, nil
		}
		return supervisor.FindControlSocket(*baseID)
	}
}

// statusCmd runs `hotproxy status`.
func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("status [--base-id B | --control-socket PATH] [--json]",
		"Asks the running supervisor for its generations: epoch, pid, state\n"+
			"(starting, serving, draining, failed, stopping), age and version.", stderr)
	socket := controlFlags(fs)
	asJSON := fs.Bool("json", false, "print the supervisor's JSON answer")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	path, err := socket()
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy status: %v\n", err)
		return 1
	}
	resp, err := supervisor.Call(path, supervisor.OpStatus, 10*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy status: %v\n", err)
		return 1
	}
	if !resp.OK || resp.Status == nil {
		fmt.Fprintf(stderr, "hotproxy status: %s\n", resp.Error)
		return 1
	}
	if *asJSON {
		b, _ := json.MarshalIndent(resp.Status, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	printStatus(stdout, resp.Status)
	return 0
}

func printStatus(w io.Writer, st *supervisor.Status) {
	fmt.Fprintf(w, "supervisor pid %d, version %s, up %s, base-id %d, config %s\n",
		st.PID, st.Version, time.Since(st.Started).Round(time.Second), st.BaseID, st.Config)
	fmt.Fprintf(w, "reloads: %d ok, %d failed; re-executed %d times; keeps %d listening sockets for a crash\n",
		st.Reloads, st.FailedReloads, st.Reexecs, st.KeptSockets)
	if st.Waiting != "" {
		fmt.Fprintf(w, "a reload waits: %s\n", st.Waiting)
	}
	if st.LastFailure != nil {
		fmt.Fprintf(w, "last failure (%s ago): %s\n", time.Since(st.LastFailure.At).Round(time.Second), st.LastFailure.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EPOCH\tPID\tSTATE\tAGE\tVERSION")
	for _, g := range st.Generations {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", g.Epoch, g.PID, g.State,
			(time.Duration(g.AgeSeconds * float64(time.Second))).Round(time.Second), g.Version)
	}
	tw.Flush()
}

// reloadProgressAfter is how long `hotproxy reload` waits for its answer
// before it asks the supervisor (status) what the reload waits for.
const reloadProgressAfter = time.Second

// callReporting is supervisor.CallRequest, and while the answer has not
// come, every reloadProgressAfter it asks the supervisor's status on a
// second connection and prints on stderr what the reload waits for and
// for how long at most, each time that changes (a reload past
// max_draining_generations waits for a generation to exit, which may take
// a whole drain_time).
func callReporting(path string, req supervisor.Request, timeout time.Duration, stderr io.Writer) (*supervisor.Response, error) {
	type answer struct {
		resp *supervisor.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := supervisor.CallRequest(path, req, timeout)
		done <- answer{resp, err}
	}()
	tick := time.NewTicker(reloadProgressAfter)
	defer tick.Stop()
	said := ""
	for {
		select {
		case a := <-done:
			return a.resp, a.err
		case <-tick.C:
		}
		st, err := supervisor.Call(path, supervisor.OpStatus, reloadProgressAfter)
		if err != nil || st.Status == nil || st.Status.Waiting == "" || st.Status.Waiting == said {
			continue
		}
		// The ages in it change each time: print when what it waits for
		// changes, not every tick.
		key := waitingKey(st.Status.Waiting)
		if key == said {
			continue
		}
		said = key
		fmt.Fprintf(stderr, "hotproxy reload: waiting: %s\n", st.Status.Waiting)
	}
}

// waitingKey is a Waiting message without its ages ("told to stop 1.2s
// ago"), so that the same wait is printed once.
func waitingKey(w string) string {
	return waitingAge.ReplaceAllString(w, "told to stop")
}

var waitingAge = regexp.MustCompile(`told to stop [0-9.a-zµ]+ ago`)

// reloadCmd runs `hotproxy reload`.
func reloadCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("reload [--base-id B | --control-socket PATH] [--wait-commit | --supervisor]",
		"Asks the running supervisor to start the next generation from the binary\n"+
			"and config on disk, and waits for the outcome: exits 0 when the new\n"+
			"generation serves, 1 when it failed (the previous one still serves).\n"+
			"With --wait-commit, it also waits for the commit window (the new\n"+
			"generation served that long, or a newer reload superseded it) and exits\n"+
			"1 if the new generation died within it and the previous one serves\n"+
			"again: what systemctl reload runs (systemd/hotproxy.service).\n"+
			"With --supervisor, the supervisor re-executes its own binary in place\n"+
			"instead (same pid, generations kept).\n"+
			"A reload that cannot start its generation at once (max_draining_generations\n"+
			"reached: it waits for a generation told to stop to exit, up to a drain_time)\n"+
			"says on stderr what it waits for and for how long at most.", stderr)
	socket := controlFlags(fs)
	self := fs.Bool("supervisor", false, "re-execute the supervisor itself in place (no new generation)")
	waitCommit := fs.Bool("wait-commit", false, "also wait for the new generation's commit window; a rollback is a failure")
	timeout := fs.Duration("timeout", supervisor.DefaultClientTimeout, "how long to wait for the outcome")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	op := supervisor.OpReload
	if *self {
		op = supervisor.OpReexec
	}
	path, err := socket()
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy reload: %v\n", err)
		return 1
	}
	resp, err := callReporting(path, supervisor.Request{Op: op, WaitCommit: *waitCommit && !*self}, *timeout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy reload: %v\n", err)
		return 1
	}
	if *self {
		if !resp.OK || resp.Status == nil {
			fmt.Fprintf(stderr, "hotproxy reload: %s\n", resp.Error)
			return 1
		}
		fmt.Fprintf(stdout, "supervisor re-executed in place: pid %d, version %s\n", resp.Status.PID, resp.Status.Version)
		return 0
	}
	if resp.Reload == nil {
		fmt.Fprintf(stderr, "hotproxy reload: %s\n", resp.Error)
		return 1
	}
	if !resp.Reload.OK {
		fmt.Fprintf(stderr, "hotproxy %s\n", resp.Reload)
		return 1
	}
	fmt.Fprintf(stdout, "hotproxy %s\n", resp.Reload)
	return 0
}
