//go:build !linux

package collector

import "net"

func raiseReadBuffer(conn *net.UDPConn, size int) { _ = conn.SetReadBuffer(size) }

func kernelDrops(*net.UDPConn) (uint64, bool) { return 0, false }
