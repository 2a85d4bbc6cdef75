//go:build linux

package steering

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// The state map is one BPF_F_MMAPABLE array entry of 64-bit words, shared
// by the program and the workers without a syscall: the workers add to
// their active count with plain atomic adds on the mapping.
//
// The program drops new connections for two reasons, each with a word of
// its own so that neither can undo the other: a generation that stops for
// good (RefuseNew, one-way) and the overload manager's stop_accepting
// (Shed, on and off). It counts each connection it drops in the counter
// of the reason, the stopping one first where both hold.
const (
	wordLive        = 0 // sockets in the socket array, indexes 0..live-1
	wordMode        = 1 // Mode
	wordMigrated    = 2 // connections the program moved off a closing socket
	wordRefuse      = 3 // non-zero: new connections are dropped (RefuseNew), for good
	wordShed        = 4 // non-zero: new connections are dropped (Shed), while it lasts
	wordRefused     = 5 // connections dropped for wordRefuse
	wordShedRefused = 6 // connections dropped for wordShed alone
	wordActive      = 8 // first of MaxSockets active-connection counts, by index
	stateWords      = wordActive + MaxSockets
)

// struct sk_reuseport_md field offsets (include/uapi/linux/bpf.h).
const (
	ctxHash        = 32 // __u32 hash: the flow hash of the packet
	ctxMigratingSk = 48 // struct bpf_sock *migrating_sk: set when migrating
)

const (
	skDrop = 0 // SK_DROP
	skPass = 1 // SK_PASS
)

// Group is one listener's steering: the program, its socket array and its
// state map. Close releases this process's descriptors of them; the
// program stays attached to the socket group until another replaces it or
// the last socket closes.
type Group struct {
	mode    Mode
	sockets *ebpf.Map
	state   *ebpf.Map
	prog    *ebpf.Program
	mem     []byte              // the state map, mapped shared
	words   *[stateWords]uint64 // mem as words

	closeOnce sync.Once
	closeErr  error
}

var memlockOnce sync.Once

// New loads the program and its maps for mode. The error says why the
// kernel refused (and wraps ErrNotSupported where the kernel lacks a
// feature, or the EPERM of a missing CAP_BPF).
func New(mode Mode) (*Group, error) {
	if mode != LeastConn && mode != Hash {
		return nil, fmt.Errorf("steering: unknown mode %d", mode)
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later
	// ones to the cgroup, and this is a no-op there.
	memlockOnce.Do(func() { _ = rlimit.RemoveMemlock() })

	g := &Group{mode: mode}
	var err error
	g.sockets, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "hp_socks", Type: ebpf.ReusePortSockArray,
		KeySize: 4, ValueSize: 8, MaxEntries: MaxSockets,
	})
	if err != nil {
		return nil, explain("create the reuseport socket array", err)
	}
	g.state, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "hp_state", Type: ebpf.Array,
		KeySize: 4, ValueSize: stateWords * 8, MaxEntries: 1,
		Flags: unix.BPF_F_MMAPABLE,
	})
	if err != nil {
		g.Close()
		return nil, explain("create the mmapable state map", err)
	}
	size := (stateWords*8 + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1)
	g.mem, err = unix.Mmap(g.state.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		g.mem = nil
		g.Close()
		return nil, explain("mmap the state map", err)
	}
	g.words = (*[stateWords]uint64)(unsafe.Pointer(&g.mem[0]))
	atomic.StoreUint64(&g.words[wordMode], uint64(mode))

	g.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "hp_steer",
		Type:         ebpf.SkReuseport,
		AttachType:   ebpf.AttachSkReuseportSelectOrMigrate,
		License:      "Dual MIT/GPL",
		Instructions: program(g.state.FD(), g.sockets.FD()),
	})
	if err != nil {
		g.Close()
		g.unmap()
		return nil, explain("load the SK_REUSEPORT program", err)
	}
	return g, nil
}

// Probe reports whether New would work here: nil, or why not.
func Probe() error {
	g, err := New(LeastConn)
	if err != nil {
		return err
	}
	return errors.Join(g.Close(), g.unmap())
}

// explain wraps a refusal of the kernel with what to do about it.
func explain(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%s: %w (the process lacks CAP_BPF, or a seccomp filter refuses bpf(2): grant CAP_BPF, allow the bpf system call, or set balance = \"kernel\")", what, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%s: %w (needs Linux 5.14 or later for BPF_SK_REUSEPORT_SELECT_OR_MIGRATE): %w", what, err, ErrNotSupported)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// program is the SK_REUSEPORT program. In C it would read:
//
//	state = lookup(&hp_state, 0); if (!state || !state->live) return SK_PASS;
//	if ((state->refuse || state->shed) && !ctx->migrating_sk) {
//		if (state->refuse) state->refused++; else state->shed_refused++;
//		return SK_DROP;
//	}
//	live = min(state->live, MaxSockets); start = ctx->hash % live;
//	if (state->mode == Hash) idx = start;
//	else idx = the i in start, start+1, ... (mod live) with the smallest
//	           state->active[i], the first one on ties;
//	bpf_sk_select_reuseport(ctx, &hp_socks, &idx, 0);
//	if (ctx->migrating_sk) state->migrated++;
//	return SK_PASS;
//
// A failed select (an empty slot: that socket closed) returns SK_PASS
// with nothing selected, and the kernel falls back to its flow hash over
// the group's live sockets: for a migration too, never a reset. The scan
// is unrolled MaxSockets times with constant bounds, which every verifier
// since 5.14 accepts; the index is masked so that it provably stays in
// the map value. The scan has no branch but its exit: the index is
// (start+i) % live, not a compare and subtract, and the minimum is taken
// with a sign mask (counts stay far below 2^63). With CAP_BPF but not
// CAP_PERFMON the verifier applies its Spectre v1 rules: it refuses
// pointer arithmetic whose scalar comes from paths with different bounds,
// and explores speculative paths too, so a branch per step would cost
// it 2^MaxSockets states.
func program(stateFD, socketsFD int) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // ctx
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, stateFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R7, asm.R0), // state
		asm.LoadMem(asm.R9, asm.R7, wordLive*8, asm.DWord),
		asm.JEq.Imm(asm.R9, 0, "pass"),
		// RefuseNew or Shed: a new connection is dropped (the kernel
		// answers its SYN with a reset: refused at once, never queued
		// and then reset) and counted; a migration still goes to a
		// live socket.
		asm.LoadMem(asm.R1, asm.R7, wordRefuse*8, asm.DWord),
		asm.LoadMem(asm.R2, asm.R7, wordShed*8, asm.DWord),
		asm.Mov.Reg(asm.R3, asm.R1),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.JEq.Imm(asm.R3, 0, "open"),
		asm.LoadMem(asm.R3, asm.R6, ctxMigratingSk, asm.DWord),
		asm.JNE.Imm(asm.R3, 0, "open"),
		asm.Mov.Imm(asm.R3, 1),
		asm.JEq.Imm(asm.R1, 0, "shed"),
		asm.AddAtomic.Mem(asm.R7, asm.R3, asm.DWord, wordRefused*8),
		asm.Ja.Label("drop"),
		asm.AddAtomic.Mem(asm.R7, asm.R3, asm.DWord, wordShedRefused*8).WithSymbol("shed"),
		asm.Mov.Imm(asm.R0, skDrop).WithSymbol("drop"),
		asm.Return(),
		asm.JLE.Imm(asm.R9, MaxSockets, "clamped").WithSymbol("open"),
		asm.Mov.Imm(asm.R9, MaxSockets),
		asm.LoadMem(asm.R8, asm.R6, ctxHash, asm.Word).WithSymbol("clamped"),
		asm.Mod.Reg(asm.R8, asm.R9), // start
		asm.Mov.Reg(asm.R0, asm.R8), // chosen index
		asm.LoadMem(asm.R1, asm.R7, wordMode*8, asm.DWord),
		asm.JEq.Imm(asm.R1, int32(Hash), "select"),
		asm.LoadImm(asm.R1, math.MaxInt64, asm.DWord), // fewest so far
	}
	for i := range MaxSockets {
		insns = append(insns,
			asm.JLE.Imm(asm.R9, int32(i), "select").WithSymbol(fmt.Sprintf("scan%d", i)),
			// r2 = (start + i) % live: the candidate
			asm.Mov.Reg(asm.R2, asm.R8),
			asm.Add.Imm(asm.R2, int32(i)),
			asm.Mod.Reg(asm.R2, asm.R9),
			asm.And.Imm(asm.R2, MaxSockets-1),
			// r3 = state->active[r2]
			asm.Mov.Reg(asm.R3, asm.R2),
			asm.LSh.Imm(asm.R3, 3),
			asm.Add.Reg(asm.R3, asm.R7),
			asm.LoadMem(asm.R3, asm.R3, wordActive*8, asm.DWord),
			// r4 = all ones if r3 < r1 (fewest so far), else 0
			asm.Mov.Reg(asm.R4, asm.R3),
			asm.Sub.Reg(asm.R4, asm.R1),
			asm.Mov.Reg(asm.R5, asm.R4),
			asm.ArSh.Imm(asm.R4, 63),
			// r1 = min(r1, r3); r0 = r4 ? r2 : r0
			asm.And.Reg(asm.R5, asm.R4),
			asm.Add.Reg(asm.R1, asm.R5),
			asm.Mov.Reg(asm.R5, asm.R2),
			asm.Xor.Reg(asm.R5, asm.R0),
			asm.And.Reg(asm.R5, asm.R4),
			asm.Xor.Reg(asm.R0, asm.R5),
		)
	}
	insns = append(insns,
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.Word).WithSymbol("select"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, socketsFD),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -8),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
		asm.LoadMem(asm.R1, asm.R6, ctxMigratingSk, asm.DWord),
		asm.JEq.Imm(asm.R1, 0, "pass"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, wordMigrated*8),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	)
	return insns
}

// Attach puts the listening sockets into the socket array, index i for
// conns[i] (the worker that accepts on it), and attaches the program to
// their SO_REUSEPORT group, replacing whatever program the group had (the
// previous generation's: the switch is atomic, no connection is steered
// by neither). Every socket must already listen, in the same group.
func (g *Group) Attach(conns []syscall.Conn) error {
	if len(conns) == 0 || len(conns) > MaxSockets {
		return fmt.Errorf("steering: %d sockets (want 1 to %d)", len(conns), MaxSockets)
	}
	for i, c := range conns {
		err := withFD(c, func(fd int) error { return g.sockets.Put(uint32(i), uint64(fd)) })
		if err != nil {
			return fmt.Errorf("steering: put socket %d in the socket array: %w", i, err)
		}
	}
	atomic.StoreUint64(&g.words[wordLive], uint64(len(conns)))
	err := withFD(conns[0], func(fd int) error {
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, g.prog.FD())
	})
	if err != nil {
		return fmt.Errorf("steering: setsockopt SO_ATTACH_REUSEPORT_EBPF: %w", err)
	}
	return nil
}

// Release takes the sockets out of the group's socket array, so that
// another generation can put them in its own: a socket can be in one
// socket array only (the kernel answers EBUSY). Until that generation
// attaches its program, this one picks nothing and the kernel spreads
// new connections by flow hash; a closing socket's queue still migrates
// (by flow hash). Release is for the hand-over; it is idempotent.
func (g *Group) Release() error {
	live := atomic.SwapUint64(&g.words[wordLive], 0)
	var errs []error
	for i := range min(live, MaxSockets) {
		if err := g.sockets.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("steering: take socket %d out of the socket array: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Detach removes whatever program c's SO_REUSEPORT group has (a previous
// generation's), so that the kernel spreads by flow hash again. A group
// with no program is not an error.
func Detach(c syscall.Conn) error {
	err := withFD(c, func(fd int) error {
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
	})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("steering: setsockopt SO_DETACH_REUSEPORT_BPF: %w", err)
	}
	return nil
}

// Active is the active-connection count of the socket at index i, for its
// worker to add to atomically (+1 on accept, -1 on close), or nil when i
// is out of range.
func (g *Group) Active(i int) *atomic.Uint64 {
	if g == nil || i < 0 || i >= MaxSockets {
		return nil
	}
	return (*atomic.Uint64)(unsafe.Pointer(&g.words[wordActive+i]))
}

// Migrated is how many connections the program has moved off a closing
// socket of the group since New (to the socket it selected, or by the
// kernel's flow hash where its pick had just closed).
func (g *Group) Migrated() uint64 {
	if g == nil || g.words == nil {
		return 0
	}
	return atomic.LoadUint64(&g.words[wordMigrated])
}

// RefuseNew makes the program drop every new connection from now on (the
// client is refused at once), while it still migrates queued ones: a
// generation that stops for good calls it before it empties its queues,
// so that nothing enters a queue after the last accept, to be reset by
// the close. A group whose sockets were handed over (Release) steers
// nothing, so this does not touch a successor. Shed(false) does not undo
// it, and its drops count in Refused, not ShedRefused.
func (g *Group) RefuseNew() { atomic.StoreUint64(&g.words[wordRefuse], 1) }

// Refused is how many new connections the program dropped since
// RefuseNew.
func (g *Group) Refused() uint64 {
	if g == nil || g.words == nil {
		return 0
	}
	return atomic.LoadUint64(&g.words[wordRefused])
}

// Shed turns the overload manager's refusal on or off: while on, the
// program drops every new connection (the client is refused at once) and
// counts it in ShedRefused; queued ones still migrate. Turning it off
// lets new connections in again, unless RefuseNew was called: a stopping
// generation stays closed whatever the overload manager does.
func (g *Group) Shed(on bool) {
	var v uint64
	if on {
		v = 1
	}
	atomic.StoreUint64(&g.words[wordShed], v)
}

// ShedRefused is how many new connections the program dropped because of
// Shed since New: a count that only grows, across any number of turns on
// and off, for the reader to take deltas of. A connection dropped while
// RefuseNew holds too is counted in Refused, not here.
func (g *Group) ShedRefused() uint64 {
	if g == nil || g.words == nil {
		return 0
	}
	return atomic.LoadUint64(&g.words[wordShedRefused])
}

// Mode is the group's mode.
func (g *Group) Mode() Mode { return g.mode }

// Close releases this process's descriptors of the program and maps. It
// does not detach the program, and it leaves the state mapped: a
// connection that outlives its Manager may still count itself out through
// Active's counter, which must never point at unmapped memory. The page
// (and the map it keeps alive) goes with the process.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		var errs []error
		for _, c := range []interface{ Close() error }{g.prog, g.state, g.sockets} {
			if c != nil && !isNilPtr(c) {
				errs = append(errs, c.Close())
			}
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// unmap releases the state mapping of a Group whose counters nobody holds.
func (g *Group) unmap() error {
	if g.mem == nil {
		return nil
	}
	err := unix.Munmap(g.mem)
	g.mem, g.words = nil, nil
	return err
}

func isNilPtr(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *ebpf.Program:
		return v == nil
	case *ebpf.Map:
		return v == nil
	}
	return false
}

func withFD(c syscall.Conn, f func(fd int) error) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// migrateSysctl is the kernel's own migration switch, for groups with no
// program: the kernel then moves a closing socket's queue to another
// socket of the group by flow hash.
const migrateSysctl = "/proc/sys/net/ipv4/tcp_migrate_req"

// MigrateSysctl turns net.ipv4.tcp_migrate_req on where it is not yet and
// the process may write it. It reports whether it is on.
func MigrateSysctl() (bool, error) {
	b, err := os.ReadFile(migrateSysctl)
	if err != nil {
		return false, fmt.Errorf("read %s: %w (Linux 5.14 or later has it)", migrateSysctl, err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return true, nil
	}
	if err := os.WriteFile(migrateSysctl, []byte("1\n"), 0); err != nil {
		return false, fmt.Errorf("write %s: %w (set net.ipv4.tcp_migrate_req = 1 with sysctl as root)", migrateSysctl, err)
	}
	return true, nil
}
