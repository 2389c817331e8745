package collector

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SO_MEMINFO's array, from linux/sock_diag.h (x/sys does not name them).
const (
	skMeminfoDrops = 8
	skMeminfoVars  = 9
)

// raiseReadBuffer asks for a receive buffer of size bytes: with
// SO_RCVBUFFORCE when the process may (CAP_NET_ADMIN), so that
// net.core.rmem_max does not cap it, else as far as rmem_max allows.
func raiseReadBuffer(conn *net.UDPConn, size int) {
	_ = conn.SetReadBuffer(size)
	rc, err := conn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
	})
}

// kernelDrops is the number of datagrams the kernel dropped on conn for
// want of room in its receive buffer (SO_MEMINFO's drop count).
func kernelDrops(conn *net.UDPConn) (uint64, bool) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info [skMeminfoVars]uint32
	ok := false
	_ = rc.Control(func(fd uintptr) {
		l := uint32(unsafe.Sizeof(info))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
		ok = errno == 0 && l > skMeminfoDrops*4
	})
	if !ok {
		return 0, false
	}
	return uint64(info[skMeminfoDrops]), true
}
