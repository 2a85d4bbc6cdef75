package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// The few terminal calls `hotproxy top` needs, on the tty's file
// descriptor: whether it is a terminal, its size, and cbreak mode. Kept
// here rather than a new dependency (golang.org/x/term does the same with
// the same x/sys calls).

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalSize is f's size in columns and rows.
func terminalSize(f *os.File) (cols, rows int, err error) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0, err
	}
	return int(ws.Col), int(ws.Row), nil
}

// cbreak turns off line buffering and echo on f, so each key arrives as
// it is typed, and returns what restores the terminal as it was. Output
// processing and signals (Ctrl-C) are left on: \n still moves to a new
// line, and Ctrl-C still interrupts.
func cbreak(f *os.File) (restore func(), err error) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Lflag &^= unix.ICANON | unix.ECHO
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &t); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
