//go:build linux && cgo

package nsinit

const cgoEnabled = true
