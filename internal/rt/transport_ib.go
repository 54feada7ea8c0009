package rt

// RDMA over verbs (rc_verbs). It builds without cgo (CGO_ENABLED=0 or the
// noverbs tag) and reports itself unavailable on hosts without rdma-core.
import _ "github.com/gouct/gouct/uct/ib"
