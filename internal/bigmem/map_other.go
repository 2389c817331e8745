//go:build !linux

package bigmem

import (
	"errors"
	"unsafe"
)

func mapHuge(uintptr) (unsafe.Pointer, uintptr, error) {
	return nil, 0, errors.New("bigmem: no anonymous mappings on this platform")
}

func unmap(region) {}

func resident(region) (int, error) { return 0, nil }
