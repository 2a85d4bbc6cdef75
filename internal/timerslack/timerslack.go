// Package timerslack sets the Linux timer slack of a process's threads:
// how late the kernel may end a thread's timed sleep (nanosleep, a futex
// or epoll_wait timeout) so as to wake it together with other timers.
//
// hotproxy raises it (server.timer_slack) for the Go runtime's sake: its
// scheduler monitor (sysmon) sleeps 20µs at a time while any P runs, and
// on a core that the workers keep busy each wake-up preempts one of them
// and, when it finds a P in a system call over two such sleeps, hands the
// P to another thread. With a slack of 1ms those wake-ups come a twentieth
// as often; no wake-up on a socket waits for it, only timers.
package timerslack

// Result is what Set did.
type Result struct {
	// Threads is how many threads the process had when Set looked last.
	Threads int
	// Unset is how many of them kept another slack (0: all have it).
	Unset int
}
