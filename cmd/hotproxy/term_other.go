//go:build !linux

package main

import (
	"errors"
	"os"
)

var errNoTerminal = errors.New("terminal control is implemented for Linux only")

func isTerminal(*os.File) bool { return false }

func terminalSize(*os.File) (int, int, error) { return 0, 0, errNoTerminal }

func cbreak(*os.File) (func(), error) { return nil, errNoTerminal }
