//go:build linux && cgo && !noverbs

#include "shim.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>

// Resolved at gouct_load; the names say which exported symbol each holds.
static struct ibv_device **(*f_get_device_list)(int *);
static void (*f_free_device_list)(struct ibv_device **);
static const char *(*f_get_device_name)(struct ibv_device *);
static struct ibv_context *(*f_open_device)(struct ibv_device *);
static int (*f_close_device)(struct ibv_context *);
static int (*f_query_device)(struct ibv_context *, struct ibv_device_attr *);
static int (*f_query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
static int (*f_query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
static ssize_t (*f_query_gid_table)(struct ibv_context *, struct ibv_gid_entry *, size_t, uint32_t, size_t);
static struct ibv_pd *(*f_alloc_pd)(struct ibv_context *);
static int (*f_dealloc_pd)(struct ibv_pd *);
static struct ibv_mr *(*f_reg_mr)(struct ibv_pd *, void *, size_t, int);
static int (*f_dereg_mr)(struct ibv_mr *);
static struct ibv_comp_channel *(*f_create_comp_channel)(struct ibv_context *);
static int (*f_destroy_comp_channel)(struct ibv_comp_channel *);
static struct ibv_cq *(*f_create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
static int (*f_destroy_cq)(struct ibv_cq *);
static int (*f_get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
static void (*f_ack_cq_events)(struct ibv_cq *, unsigned int);
static struct ibv_srq *(*f_create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
static int (*f_destroy_srq)(struct ibv_srq *);
static struct ibv_qp *(*f_create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
static int (*f_destroy_qp)(struct ibv_qp *);
static int (*f_modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
static int (*f_query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
static int (*f_fork_init)(void);
static enum ibv_fork_status (*f_is_fork_initialized)(void);
static int (*f_get_async_event)(struct ibv_context *, struct ibv_async_event *);
static void (*f_ack_async_event)(struct ibv_async_event *);

#define REQUIRE(var, name) do { \
	*(void **)(&var) = dlsym(h, name); \
	if (!var) { snprintf(err, errlen, "libibverbs: symbol %s missing", name); return -1; } \
} while (0)
#define OPTIONAL(var, name) (*(void **)(&var) = dlsym(h, name))

int gouct_load(const char *lib, char *err, size_t errlen) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	REQUIRE(f_get_device_list, "ibv_get_device_list");
	REQUIRE(f_free_device_list, "ibv_free_device_list");
	REQUIRE(f_get_device_name, "ibv_get_device_name");
	REQUIRE(f_open_device, "ibv_open_device");
	REQUIRE(f_close_device, "ibv_close_device");
	REQUIRE(f_query_device, "ibv_query_device");
	REQUIRE(f_query_port, "ibv_query_port");
	REQUIRE(f_query_gid, "ibv_query_gid");
	OPTIONAL(f_query_gid_table, "_ibv_query_gid_table");
	REQUIRE(f_alloc_pd, "ibv_alloc_pd");
	REQUIRE(f_dealloc_pd, "ibv_dealloc_pd");
	REQUIRE(f_reg_mr, "ibv_reg_mr");
	REQUIRE(f_dereg_mr, "ibv_dereg_mr");
	REQUIRE(f_create_comp_channel, "ibv_create_comp_channel");
	REQUIRE(f_destroy_comp_channel, "ibv_destroy_comp_channel");
	REQUIRE(f_create_cq, "ibv_create_cq");
	REQUIRE(f_destroy_cq, "ibv_destroy_cq");
	REQUIRE(f_get_cq_event, "ibv_get_cq_event");
	REQUIRE(f_ack_cq_events, "ibv_ack_cq_events");
	REQUIRE(f_create_srq, "ibv_create_srq");
	REQUIRE(f_destroy_srq, "ibv_destroy_srq");
	REQUIRE(f_create_qp, "ibv_create_qp");
	REQUIRE(f_destroy_qp, "ibv_destroy_qp");
	REQUIRE(f_modify_qp, "ibv_modify_qp");
	REQUIRE(f_query_qp, "ibv_query_qp");
	REQUIRE(f_fork_init, "ibv_fork_init");
	OPTIONAL(f_is_fork_initialized, "ibv_is_fork_initialized");
	REQUIRE(f_get_async_event, "ibv_get_async_event");
	REQUIRE(f_ack_async_event, "ibv_ack_async_event");
	return 0;
}

int gouct_device_names(char *names, int max) {
	int n = 0;
	errno = 0;
	struct ibv_device **l = f_get_device_list(&n);
	if (!l) return errno ? -errno : -ENODEV;
	int i;
	for (i = 0; i < n && i < max; i++)
		snprintf(names + 64 * i, 64, "%s", f_get_device_name(l[i]));
	f_free_device_list(l);
	return i;
}

struct ibv_context *gouct_open(const char *name) {
	int n = 0;
	struct ibv_device **l = f_get_device_list(&n);
	if (!l) return NULL;
	struct ibv_context *ctx = NULL;
	errno = ENODEV;
	for (int i = 0; i < n; i++) {
		if (strcmp(f_get_device_name(l[i]), name) == 0) {
			ctx = f_open_device(l[i]);
			break;
		}
	}
	int e = errno;
	f_free_device_list(l);
	errno = e;
	return ctx;
}

int gouct_close(struct ibv_context *ctx) { return f_close_device(ctx); }
int gouct_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) { return f_query_device(ctx, a); }

// The port attributes go through the context's extended op when the provider
// has one (what verbs.h's inline ibv_query_port does), else the exported call.
int gouct_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a) {
	memset(a, 0, sizeof *a);
	struct verbs_context *v = verbs_get_ctx_op(ctx, query_port);
	if (v) return v->query_port(ctx, port, a, sizeof *a);
	return f_query_port(ctx, port, a);
}

int gouct_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
	return f_query_gid(ctx, port, index, gid);
}

long gouct_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max) {
	if (!f_query_gid_table) return -ENOSYS;
	ssize_t n = f_query_gid_table(ctx, e, max, 0, sizeof *e);
	return n;
}

struct ibv_pd *gouct_alloc_pd(struct ibv_context *ctx) { return f_alloc_pd(ctx); }
int gouct_dealloc_pd(struct ibv_pd *pd) { return f_dealloc_pd(pd); }
struct ibv_mr *gouct_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access) {
	return f_reg_mr(pd, (void *)addr, len, access);
}
int gouct_dereg_mr(struct ibv_mr *mr) { return f_dereg_mr(mr); }

struct ibv_comp_channel *gouct_create_comp_channel(struct ibv_context *ctx) { return f_create_comp_channel(ctx); }
int gouct_destroy_comp_channel(struct ibv_comp_channel *ch) { return f_destroy_comp_channel(ch); }
struct ibv_cq *gouct_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *ch) {
	return f_create_cq(ctx, cqe, NULL, ch, 0);
}
int gouct_destroy_cq(struct ibv_cq *cq) { return f_destroy_cq(cq); }
struct ibv_cq *gouct_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	if (f_get_cq_event(ch, &cq, &ctx)) return NULL;
	return cq;
}
void gouct_ack_cq_events(struct ibv_cq *cq, unsigned int n) { f_ack_cq_events(cq, n); }
int gouct_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

struct ibv_srq *gouct_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge) {
	struct ibv_srq_init_attr a;
	memset(&a, 0, sizeof a);
	a.attr.max_wr = max_wr;
	a.attr.max_sge = max_sge;
	return f_create_srq(pd, &a);
}
int gouct_destroy_srq(struct ibv_srq *srq) { return f_destroy_srq(srq); }

struct ibv_qp *gouct_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		struct ibv_srq *srq, uint32_t max_send_wr, uint32_t max_send_sge, uint32_t max_inline,
		uint32_t *got_inline) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_inline_data = max_inline;
	struct ibv_qp *qp = f_create_qp(pd, &a);
	if (qp) *got_inline = a.cap.max_inline_data;
	return qp;
}
int gouct_destroy_qp(struct ibv_qp *qp) { return f_destroy_qp(qp); }

int gouct_qp_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.qp_access_flags = access;
	return f_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int gouct_qp_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dqpn, uint32_t rq_psn, int mtu,
		uint16_t dlid, const uint8_t *dgid, int is_global, int sgid_index, int max_dest_rd_atomic,
		int min_rnr_timer) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = max_dest_rd_atomic;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = port;
	if (is_global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	return f_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int gouct_qp_rts(struct ibv_qp *qp, uint32_t sq_psn, int timeout, int retry, int rnr_retry,
		int max_rd_atomic) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr_retry;
	a.max_rd_atomic = max_rd_atomic;
	return f_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int gouct_qp_to_err(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return f_modify_qp(qp, &a, IBV_QP_STATE);
}

int gouct_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }

const char *gouct_dev_path(struct ibv_context *ctx) { return ctx->device->dev_path; }

/* Packs the event as type | port << 8 | qpn << 16 (no out-pointers: Go
 * pointers passed to C escape, and the device check runs 5 times a second
 * without allocating); -errno on error. */
int64_t gouct_get_async_event(struct ibv_context *ctx) {
	struct ibv_async_event ev;
	if (f_get_async_event(ctx, &ev) != 0) return errno ? -errno : -EIO;
	uint64_t qpn = 0, port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		qpn = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		port = ev.element.port_num & 0xff;
		break;
	default:
		break;
	}
	int64_t r = (int64_t)(((uint64_t)ev.event_type & 0xff) | port << 8 | (qpn & 0xffffffff) << 16);
	f_ack_async_event(&ev);
	return r;
}

int gouct_qp_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof a);
	int rc = f_query_qp(qp, &a, IBV_QP_STATE, &ia);
	return rc ? -rc : (int)a.qp_state;
}

int gouct_fork_status(void) { return f_is_fork_initialized ? (int)f_is_fork_initialized() : -1; }
int gouct_fork_init(void) { return f_fork_init(); }

int gouct_post_send(struct ibv_qp *qp, const struct gouct_wr *w, struct ibv_sge *sge) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = w->wr_id;
	wr.sg_list = sge;
	wr.num_sge = (int)w->nsge;
	wr.opcode = (enum ibv_wr_opcode)w->opcode;
	wr.send_flags = w->flags;
	wr.imm_data = htonl(w->imm);
	wr.wr.rdma.remote_addr = w->raddr;
	wr.wr.rdma.rkey = w->rkey;
	return ibv_post_send(qp, &wr, &bad);
}

int gouct_post_inline(struct ibv_qp *qp, uint64_t wr_id, uint32_t imm, uint64_t hdr,
		uintptr_t p, uint32_t len, uint32_t flags) {
	struct ibv_sge sge[2];
	struct ibv_send_wr wr, *bad = NULL;
	// The 8-byte header goes little-endian on the wire (uct.AMHandler's layout).
	uint8_t h[8];
	for (int i = 0; i < 8; i++) h[i] = (uint8_t)(hdr >> (8 * i));
	sge[0].addr = (uintptr_t)h;
	sge[0].length = 8;
	sge[0].lkey = 0;
	sge[1].addr = p;
	sge[1].length = len;
	sge[1].lkey = 0;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = sge;
	wr.num_sge = len ? 2 : 1;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = flags | IBV_SEND_INLINE;
	wr.imm_data = htonl(imm);
	return ibv_post_send(qp, &wr, &bad);
}

int gouct_post_srq(struct ibv_srq *srq, const struct gouct_rbuf *b, int n) {
	struct ibv_recv_wr wr[32], *bad = NULL;
	struct ibv_sge sge[32];
	while (n > 0) {
		int k = n < 32 ? n : 32;
		for (int i = 0; i < k; i++) {
			sge[i].addr = b[i].addr;
			sge[i].length = b[i].len;
			sge[i].lkey = b[i].lkey;
			wr[i].wr_id = b[i].wr_id;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		int rc = ibv_post_srq_recv(srq, wr, &bad);
		if (rc) return rc;
		b += k;
		n -= k;
	}
	return 0;
}

int gouct_poll(struct ibv_cq *cq, struct gouct_wc *out, int n) {
	struct ibv_wc wc[32];
	if (n > 32) n = 32;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
		out[i].qp_num = wc[i].qp_num;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return got;
}

int gouct_poll2(struct ibv_cq *rcq, struct gouct_wc *rout, struct ibv_cq *scq, struct gouct_wc *sout, int n) {
	int r = gouct_poll(rcq, rout, n);
	if (r < 0) return -1;
	int s = gouct_poll(scq, sout, n);
	if (s < 0) return -1;
	return r | (s << 16);
}
