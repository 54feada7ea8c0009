// Package ibv is the only cgo in gouct: thin, owned handles over rdma-core's
// libibverbs. The library is never linked: Load dlopens libibverbs.so.1 at
// first use and resolves each exported function, so a binary built with verbs
// support starts on a host without rdma-core and reports why verbs are
// unavailable. The data path (post send, post receive, poll, arm) calls the
// provider through verbs.h's inline functions, one cgo crossing per post and
// one per batch of completions.
//
// Build: linux with cgo; the build tag noverbs (or CGO_ENABLED=0) leaves only
// Load, which then reports ErrNotBuilt.
//
// Every raw handle (Context, PD, MR, CompChannel, CQ, SRQ, QP) has an owner
// type whose Close releases it exactly once. Handles are not safe for
// concurrent use unless a method says so; package uct/ib serialises them.
package ibv

import "errors"

// ErrNotBuilt is returned by Load in builds without verbs support.
var ErrNotBuilt = errors.New("verbs support not built (CGO_ENABLED=0 or build tag noverbs)")
