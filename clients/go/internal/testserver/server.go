// Package testserver starts a real sessions-server process for tests and benchmarks.
//
// The command is the repo's .venv/bin/sessions-server (found by walking up from the working
// directory), or $SESSIONS_SERVER_CMD (split on spaces) when set. The arguments
// `serve --listen 127.0.0.1:0 --data-dir DIR` are appended; the address is read from the
// server's "sessions-server listening on HOST:PORT" line on stdout. Stop sends SIGTERM.
package testserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvCommand overrides the server command.
const EnvCommand = "SESSIONS_SERVER_CMD"

const startTimeout = 60 * time.Second

var listening = regexp.MustCompile(`sessions-server listening on (\S+)`)

// Server is a running sessions-server process with its own temporary data directory.
type Server struct {
	// Addr is the host:port the server listens on.
	Addr    string
	DataDir string

	cmd      *exec.Cmd
	ownsData bool
	workDir  string
	logPath  string
	logFile  *os.File
	waitDone chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Command returns the server command: $SESSIONS_SERVER_CMD, or the repo's
// .venv/bin/sessions-server.
func Command() ([]string, error) {
	if env := strings.TrimSpace(os.Getenv(EnvCommand)); env != "" {
		return strings.Fields(env), nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	for {
		candidate := filepath.Join(dir, ".venv", "bin", "sessions-server")
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() {
			return []string{candidate}, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil, fmt.Errorf("no .venv/bin/sessions-server above the working directory; run `make setup` at the repo root or set %s", EnvCommand)
		}
		dir = parent
	}
}

// Start starts a server on 127.0.0.1 (a free port) with a new temporary data directory, plus
// any extra server arguments, and waits until it listens. Stop removes the directory.
func Start(extraArgs ...string) (*Server, error) {
	return StartAt("127.0.0.1:0", "", extraArgs...)
}

// StartAt starts a server listening on listen with the given data directory (a new temporary
// one when empty, removed by Stop; a given one is left in place, so a restart finds its data).
func StartAt(listen, dataDir string, extraArgs ...string) (*Server, error) {
	command, err := Command()
	if err != nil {
		return nil, err
	}
	workDir, err := os.MkdirTemp("", "sessions-go-test-")
	if err != nil {
		return nil, err
	}
	s := &Server{DataDir: dataDir, workDir: workDir, waitDone: make(chan struct{})}
	if dataDir == "" {
		s.DataDir, s.ownsData = filepath.Join(workDir, "data"), true
	}
	s.logPath = filepath.Join(workDir, "server.log")
	s.logFile, err = os.Create(s.logPath)
	if err != nil {
		_ = os.RemoveAll(workDir)
		return nil, err
	}
	args := append(append([]string{}, command[1:]...), "serve", "--listen", listen, "--data-dir", s.DataDir)
	args = append(args, extraArgs...)
	s.cmd = exec.Command(command[0], args...)
	s.cmd.Stderr = s.logFile
	s.cmd.SysProcAttr = sysProcAttr()
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("start %s: %w", command[0], err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.waitDone)
	}()

	addr := make(chan string, 1)
	go func() {
		scanner := bufio.NewScanner(stdout)
		found := false
		for scanner.Scan() {
			line := scanner.Text()
			if !found {
				if m := listening.FindStringSubmatch(line); m != nil {
					found = true
					addr <- m[1]
				}
			}
			_, _ = io.WriteString(s.logFile, line+"\n")
		}
		if !found {
			close(addr)
		}
	}()

	select {
	case a, ok := <-addr:
		if !ok {
			<-s.waitDone
			err := fmt.Errorf("sessions-server exited before listening (%v):\n%s", s.waitErr, s.LogTail(4000))
			s.cleanup()
			return nil, err
		}
		s.Addr = a
		return s, nil
	case <-time.After(startTimeout):
		_ = s.Stop()
		return nil, fmt.Errorf("sessions-server did not listen within %s", startTimeout)
	}
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago, for a server
// that must come back on the same address after a restart.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// LogTail returns the last n bytes of the server's stdout and stderr.
func (s *Server) LogTail(n int) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	if len(data) > n {
		data = data[len(data)-n:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}

// Stop sends SIGTERM (SIGKILL after 20 s), waits for the process, and removes its data.
func (s *Server) Stop() error {
	var err error
	s.stopOnce.Do(func() {
		if s.cmd.Process != nil {
			_ = signalGroup(s.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-s.waitDone:
			case <-time.After(20 * time.Second):
				_ = signalGroup(s.cmd.Process.Pid, syscall.SIGKILL)
				<-s.waitDone
				err = errors.New("sessions-server did not stop on SIGTERM; killed")
			}
			var exitErr *exec.ExitError
			if err == nil && s.waitErr != nil && !errors.As(s.waitErr, &exitErr) {
				err = s.waitErr
			}
		}
		s.cleanup()
	})
	return err
}

func (s *Server) cleanup() {
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
	if s.ownsData {
		_ = os.RemoveAll(s.DataDir)
	}
	_ = os.RemoveAll(s.workDir)
}
