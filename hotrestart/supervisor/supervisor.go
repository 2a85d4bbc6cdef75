// Package supervisor runs the generations of hotproxy as its children: it
// starts epoch 0, starts each next epoch on SIGHUP or a control-socket
// request and waits for its readiness, leaves the serving generation alone
// when a new one fails, stops everything within the drain bounds on SIGTERM,
// reaps every child (it is safe as PID 1), speaks the systemd notify
// protocol itself and can re-execute its own binary in place, keeping its
// PID and its children.
//
// One goroutine owns all the state (the generations, the reload in
// progress, the queued one); signals, child exits, readiness lines and
// control requests reach it on channels. The decisions are a portable
// state machine (machine.go) that touches the system only through a small
// process table; the Linux layer (supervisor_linux.go) starts children with
// syscall.ForkExec from that goroutine and reaps them with wait4, so a pid
// is never signalled after it was reaped. docs/hot-restart.md has the
// sequence.
//
// The contract with a generation is the command line of `hotproxy serve`:
//
//	serve [-c FILE] --base-id B --restart-epoch N [--allow-cold-start] [--restart-parent PID:START|none|kept] --ready-fd 3 --supervisor-fd 4
//
// --restart-parent names the generation to take over from, from this
// supervisor's own process table (pid and /proc start time), or says that
// none serves (start cold, dial nothing), or that none serves but the
// supervisor kept its listening sockets (take them over the link);
// --supervisor-fd is that link (keeper_linux.go), over which the serving
// generation sends its sockets to keep. The supervisor also watches the
// serving generation's heartbeat in the stats region and replaces a wedged
// one; see docs/hot-restart.md. The
// generation writes "READY <pid>\n" or "FAILED <reason>\n" to fd 3.
package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults for Options fields left zero.
const (
	// DefaultReadyMargin is added to the config's hot_restart.handoff_timeout
	// to bound the wait for a new generation's readiness.
	DefaultReadyMargin = 5 * time.Second
	// DefaultStopMargin is added to server.parent_shutdown_time to bound a
	// stop before what is left is killed.
	DefaultStopMargin = 5 * time.Second
	// DefaultRuntimeDir holds the control socket when $RUNTIME_DIRECTORY
	// is not set.
	DefaultRuntimeDir = "/run/hotproxy"
	// MaxCrashRestarts bounds the cold restarts after the serving
	// generation died unexpectedly, within CrashWindow; past it the
	// supervisor gives up and exits non-zero.
	MaxCrashRestarts = 5
	CrashWindow      = time.Minute
)

// EnvState names the environment variable that carries the supervisor's
// state across a re-execution in place. It is internal: it is removed from
// the environment as soon as it is read.
const EnvState = "HOTPROXY_SUPERVISOR_STATE"

// ErrNotSupported is returned where the supervisor cannot run.
var ErrNotSupported = errors.New("the supervisor is not supported on this platform")

// ErrStopping is the outcome of requests that arrive while the supervisor
// is stopping.
var ErrStopping = errors.New("the supervisor is stopping")

// Options configures a Supervisor. The zero value of every field but
// nothing is required: an empty ConfigPath is the embedded default config.
type Options struct {
	// ConfigPath is passed to every generation as -c; "" = the embedded
	// default config.
	ConfigPath string
	// BaseID is passed as --base-id; it names the restart sockets and the
	// stats region.
	BaseID int
	// Binary is the program each generation runs, read from disk at each
	// start so that a replaced binary is picked up. "" = this process's
	// executable path, resolved once at start.
	Binary string
	// Self is what a re-execution in place runs. "" = this process's
	// executable path, resolved once at start.
	Self string
	// Args are this process's arguments, given again on a re-execution
	// (default os.Args).
	Args []string
	// ExtraArgs are appended to every generation's command line (e.g.
	// "--log-level", "debug").
	ExtraArgs []string
	// Env is added to the environment of every generation.
	Env []string
	// ControlSocket is the path of the control socket; "" = the first of
	// ControlSocketCandidates(BaseID) this process may bind. "-" disables it.
	ControlSocket string
	// NotifySocket is where systemd notifications go; "" = $NOTIFY_SOCKET
	// (none when that is unset too).
	NotifySocket string
	// ReapOrphans makes the supervisor reap every child, including
	// orphans re-parented to it (PID 1 or a child subreaper), and sets
	// PR_SET_CHILD_SUBREAPER when it is not PID 1. Leave it false when
	// the process starts other children of its own (tests in process).
	ReapOrphans bool
	// TakeOver makes the first generation the successor of a generation
	// of BaseID that this supervisor did not start (another container of
	// the pod, sharing the network and IPC namespaces), found from its
	// restart socket; with none running, it starts cold.
	TakeOver bool
	// WatchConfig, if set, checks ConfigPath this often and reloads when
	// its content has changed (a Kubernetes ConfigMap volume, an edited
	// file), as a SIGHUP would. 0: never; at least MinWatchConfig.
	WatchConfig time.Duration
	// ReadyMargin and StopMargin: see the defaults.
	ReadyMargin time.Duration
	StopMargin  time.Duration
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// LogFile, if set, is the file Logger writes to ([log] path): SIGUSR1
	// reopens it before the signal is forwarded to the generations.
	LogFile LogReopener
}

// LogReopener is a log file that logrotate may move away: Reopen opens its
// path again.
type LogReopener interface {
	Reopen() error
}

// DefaultControlSocket is the first of ControlSocketCandidates: the path a
// supervisor run by systemd (RuntimeDirectory=hotproxy) or by root binds.
func DefaultControlSocket(baseID int) string {
	return ControlSocketCandidates(baseID)[0]
}

// ControlSocketCandidates lists, in order, where a supervisor started
// without --control-socket binds its control socket, and so where
// `hotproxy status` and `reload` look for it:
//
//  1. $RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), when set;
//  2. /run/hotproxy, which only root can usually create;
//  3. $XDG_RUNTIME_DIR, a normal user's private runtime directory, when set;
//  4. <temp dir>/hotproxy-<uid>, a private 0700 directory, for a user with
//     neither (a container, a login without a session manager).
//
// A supervisor takes the first one it may create its socket in; a client
// takes the first one where a socket exists. The list is the same for both
// so that they agree without being told.
func ControlSocketCandidates(baseID int) []string {
	name := "hotproxy." + strconv.Itoa(baseID) + ".sock"
	var dirs []string
	if rd := os.Getenv("RUNTIME_DIRECTORY"); rd != "" {
		// systemd lists several directories separated by ':'.
		rd, _, _ = strings.Cut(rd, ":")
		dirs = append(dirs, rd)
	}
	dirs = append(dirs, DefaultRuntimeDir)
	if xdg := os.Getenv("XDG_RUNTIME_DIR"); xdg != "" {
		dirs = append(dirs, xdg)
	}
	dirs = append(dirs, PrivateRuntimeDir())
	paths := make([]string, 0, len(dirs))
	for _, d := range dirs {
		paths = append(paths, filepath.Join(d, name))
	}
	return paths
}

// PrivateRuntimeDir is the last resort of ControlSocketCandidates:
// <temp dir>/hotproxy-<uid>. Named for the uid so that two users of one
// machine do not meet there; the supervisor creates it 0700 and refuses it
// when another user owns it.
func PrivateRuntimeDir() string {
	return filepath.Join(os.TempDir(), "hotproxy-"+strconv.Itoa(os.Geteuid()))
}

// State is a generation's lifecycle state.
type State string

// Generation states.
const (
	// StateStarting: started, not ready yet.
	StateStarting State = "starting"
	// StateServing: ready; the newest generation that serves.
	StateServing State = "serving"
	// StateDraining: handed over to the next generation; it exits by itself.
	StateDraining State = "draining"
	// StateFailed: failed to start (or timed out) and was killed; it is
	// listed until it has been reaped.
	StateFailed State = "failed"
	// StateStopping: told to stop (SIGTERM) by a supervisor shutdown.
	StateStopping State = "stopping"
	// StateWedged: it served, but its heartbeat in the stats region
	// stopped for watchdog.supervisor_timeout. The next generation is
	// started (on the kept sockets); this one is SIGKILLed once that one
	// serves.
	StateWedged State = "wedged"
)

// GenerationStatus is one generation in a Status.
type GenerationStatus struct {
	Epoch      int       `json:"epoch"`
	PID        int       `json:"pid"`
	State      State     `json:"state"`
	Started    time.Time `json:"started"`
	AgeSeconds float64   `json:"age_seconds"`
	// Version is the generation binary's version as built (read from the
	// binary's build information when the generation started).
	Version string `json:"version"`
	Binary  string `json:"binary"`
}

// Failure describes the last generation that failed.
type Failure struct {
	Epoch  int       `json:"epoch"`
	PID    int       `json:"pid,omitempty"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// Status is the answer to a status request.
type Status struct {
	PID           int                `json:"pid"`
	Version       string             `json:"version"`
	Started       time.Time          `json:"started"`
	BaseID        int                `json:"base_id"`
	Config        string             `json:"config"`
	Binary        string             `json:"binary"`
	Reexecs       int                `json:"reexecs"`
	ServingEpoch  int                `json:"serving_epoch"` // -1: none
	Generations   []GenerationStatus `json:"generations"`
	Reloads       int                `json:"reloads"`
	FailedReloads int                `json:"failed_reloads"`
	LastFailure   *Failure           `json:"last_failure,omitempty"`
	Stopping      bool               `json:"stopping,omitempty"`
	// Waiting says what a requested reload waits for before it can start
	// its generation, and for how long at most ("" if none waits).
	Waiting string `json:"waiting,omitempty"`
	// Goroutines of the supervisor: a leak check across many reloads.
	Goroutines int `json:"goroutines,omitempty"`
	// RefusedControlPeers counts control connections turned away (another
	// user's); their warnings are rate-limited, this count is not.
	RefusedControlPeers uint64 `json:"refused_control_peers,omitempty"`
	// KeptSockets is how many listening sockets of the serving generation
	// the supervisor keeps for its successor (hot_restart.keep_listeners).
	KeptSockets int `json:"kept_sockets"`
}

// Serving returns the serving generation, if any.
func (s *Status) Serving() (GenerationStatus, bool) {
	for _, g := range s.Generations {
		if g.State == StateServing {
			return g, true
		}
	}
	return GenerationStatus{}, false
}

// ReloadResult is the outcome of a reload.
type ReloadResult struct {
	// OK: the new generation serves.
	OK    bool   `json:"ok"`
	Epoch int    `json:"epoch"`
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	// Committed: the new generation also outlived its commit window as
	// the serving one, or a newer reload superseded it (asked for with
	// Request.WaitCommit); a failure then may be a rollback.
	Committed bool `json:"committed,omitempty"`
	// Serving is the generation serving after the reload (the new one on
	// success, the untouched old one on failure).
	ServingEpoch int `json:"serving_epoch"`
	ServingPID   int `json:"serving_pid,omitempty"`
}

func (r ReloadResult) String() string {
	if r.OK && r.Committed {
		return fmt.Sprintf("reload: epoch %d serves (pid %d) and has committed", r.Epoch, r.PID)
	}
	if r.OK {
		return fmt.Sprintf("reload: epoch %d serves (pid %d)", r.Epoch, r.PID)
	}
	s := fmt.Sprintf("reload: epoch %d failed: %s", r.Epoch, r.Error)
	if r.ServingPID != 0 {
		s += fmt.Sprintf("; epoch %d still serves (pid %d)", r.ServingEpoch, r.ServingPID)
	} else {
		s += "; no generation serves"
	}
	return s
}
