package testserver

import "syscall"

// The server gets its own process group (so SIGTERM reaches a wrapper's children too) and is
// sent SIGTERM if the test binary dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
