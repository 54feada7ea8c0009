//go:build linux && cgo && !noverbs

// shim.h: the C side of package ibv. libibverbs is never linked: shim.c
// dlopens it at first use and resolves every exported function it calls;
// the data path (post send/recv, poll, arm) uses verbs.h's inline functions,
// which call the provider through the context's ops table.
#ifndef GOUCT_IBV_SHIM_H
#define GOUCT_IBV_SHIM_H
#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>

// gouct_load dlopens lib and resolves the symbols; 0 or -1 with the error
// text in err (errlen bytes).
int gouct_load(const char *lib, char *err, size_t errlen);

// Device list: fills names (count entries of 64 bytes) and returns the count
// or -errno.
int gouct_device_names(char *names, int max);
struct ibv_context *gouct_open(const char *name);
int gouct_close(struct ibv_context *ctx);
int gouct_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr);
int gouct_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
int gouct_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
// gouct_gid_table fills up to max entries; returns the count, -errno, or
// -ENOSYS when the library lacks ibv_query_gid_table.
long gouct_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max);

struct ibv_pd *gouct_alloc_pd(struct ibv_context *ctx);
int gouct_dealloc_pd(struct ibv_pd *pd);
// Addresses of caller memory travel as uintptr_t, never as pointers: cgo's
// pointer check would reject Go memory that holds (or sits in an object that
// holds) unpinned Go pointers, and any user buffer may be such memory.
struct ibv_mr *gouct_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access);
int gouct_dereg_mr(struct ibv_mr *mr);

struct ibv_comp_channel *gouct_create_comp_channel(struct ibv_context *ctx);
int gouct_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *gouct_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *ch);
int gouct_destroy_cq(struct ibv_cq *cq);
// gouct_get_cq_event returns the CQ of one event, or NULL with errno set
// (EAGAIN on a non-blocking channel without events).
struct ibv_cq *gouct_get_cq_event(struct ibv_comp_channel *ch);
void gouct_ack_cq_events(struct ibv_cq *cq, unsigned int n);
int gouct_req_notify(struct ibv_cq *cq);

struct ibv_srq *gouct_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge);
int gouct_destroy_srq(struct ibv_srq *srq);

struct ibv_qp *gouct_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
	struct ibv_srq *srq, uint32_t max_send_wr, uint32_t max_send_sge, uint32_t max_inline,
	uint32_t *got_inline);
int gouct_destroy_qp(struct ibv_qp *qp);
int gouct_qp_init(struct ibv_qp *qp, uint8_t port, int access);
int gouct_qp_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dqpn, uint32_t rq_psn, int mtu,
	uint16_t dlid, const uint8_t *dgid, int is_global, int sgid_index, int max_dest_rd_atomic,
	int min_rnr_timer);
int gouct_qp_rts(struct ibv_qp *qp, uint32_t sq_psn, int timeout, int retry, int rnr_retry,
	int max_rd_atomic);
int gouct_qp_to_err(struct ibv_qp *qp);
// gouct_qp_state is the QP's state (enum ibv_qp_state) or -errno.
int gouct_qp_state(struct ibv_qp *qp);

// Async events: the context's event fd; gouct_get_async_event reads and
// acknowledges one event and returns it packed, type | port << 8 | qpn << 16
// (the QP number or port it names, 0 otherwise), or -errno (-EAGAIN on a
// non-blocking fd without events).
int gouct_async_fd(struct ibv_context *ctx);
int64_t gouct_get_async_event(struct ibv_context *ctx);
// gouct_dev_path is the device's uverbs sysfs directory
// (/sys/class/infiniband_verbs/uverbsN), owned by the library.
const char *gouct_dev_path(struct ibv_context *ctx);

int gouct_fork_status(void);  // enum ibv_fork_status, or -1 when unknown
int gouct_fork_init(void);

// Data path. Layouts mirrored by Go types (checked in Go at init).
struct gouct_wr {
	uint64_t wr_id;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;     // host order; sent big-endian
	uint32_t opcode;  // enum ibv_wr_opcode
	uint32_t flags;   // enum ibv_send_flags
	uint32_t nsge;
	uint32_t pad;
};
struct gouct_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm;     // host order
	uint32_t qp_num;
	uint32_t vendor_err;
};
struct gouct_rbuf {
	uint64_t addr;
	uint64_t wr_id;
	uint32_t len;
	uint32_t lkey;
};
int gouct_post_send(struct ibv_qp *qp, const struct gouct_wr *w, struct ibv_sge *sge);
// gouct_post_inline sends hdr (8 bytes) + p[0:len] inline with immediate imm.
int gouct_post_inline(struct ibv_qp *qp, uint64_t wr_id, uint32_t imm, uint64_t hdr,
	uintptr_t p, uint32_t len, uint32_t flags);
int gouct_post_srq(struct ibv_srq *srq, const struct gouct_rbuf *b, int n);
int gouct_poll(struct ibv_cq *cq, struct gouct_wc *out, int n);
// gouct_poll2 polls up to n completions of each CQ (one crossing for a
// progress round): returns recv count | send count << 16, or -1.
int gouct_poll2(struct ibv_cq *rcq, struct gouct_wc *rout, struct ibv_cq *scq, struct gouct_wc *sout, int n);
#endif
