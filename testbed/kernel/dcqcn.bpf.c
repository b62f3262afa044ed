// SPDX-License-Identifier: GPL-2.0
/* DCQCN beside SoftRoCE (rxe): what a RoCEv2 NIC's firmware does, on the host's own interface (docs/dcqcn.md).
 * Two programs, both cls_bpf in direct-action mode on the host interface's clsact hooks:
 *
 *   dcqcn_ingress  notification point: a RoCEv2 packet (UDP 4791) with IP ECN = CE for a mapped local QP makes a
 *                  CNP, at most one per QP per cnp_interval_ns: the packet is cloned to this device's egress with
 *                  CNP_MARK (bpf_clone_redirect), the original goes on to rxe unchanged.
 *                  reaction point: a CNP (BTH opcode 0x81) for a local QP cuts that QP's rate and is dropped (rxe
 *                  has no use for it).
 *   dcqcn_egress   a CNP_MARK clone is rewritten into the CNP (addresses swapped, BTH opcode 0x81, destination QP
 *                  = the sender's QPN from the QP map, 16 reserved bytes, ICRC left zero) and sent unpaced;
 *                  every other RoCE packet gets ECT(0), and one of a QP with a rate state a departure time
 *                  (skb->tstamp, Earliest Departure Time) that the fq qdisc on the interface honours.
 *
 * The rate state machine is the one of traffic/dcqcn.py (the oracle; the same integer arithmetic, the same lazy
 * evaluation from elapsed time with the same bounded catch-up), run under the state's spin lock: everything it
 * calls is inlined (no helper and no function calls while the lock is held).
 *
 * Maps (filled and read by user space, testbed/kernel/dcqcn.py in the next step):
 *   config   [0] the parameters (struct dcqcn_config, names as traffic.dcqcn.Params)
 *   qpmap    local QPN -> (remote QPN, peer IPv4): from the RDMA netlink resource tables
 *   rp       (peer IPv4, remote QPN) -> struct rp_state: written at QP setup (rates at the line rate, alpha), the
 *            times are started by the first packet
 *   np_last  local QPN -> time of the last CNP sent for it
 *   stats    the counters below, in index order
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ROCE_V2_PORT 4791
#define BTH_OPCODE_CNP 0x81
#define CNP_MARK 0xDC0C
#define ALPHA_ONE (1U << 20)
#define G_UNIT 1024
#define MAX_CATCHUP 64
#define MAX_ROUNDS 4
/* Ethernet + IPv4 (no options) + UDP + BTH + 16 reserved bytes + ICRC */
#define CNP_LEN (14 + 20 + 8 + 12 + 16 + 4)

enum { S_CE_SEEN, S_CNP_SENT, S_CNP_SUPPRESSED, S_CNP_RECEIVED, S_CNP_IGNORED, S_RATE_CUTS, S_PACED, S_UNKNOWN_QP,
       S_CNP_FAILED, S_NSTATS };

struct dcqcn_config {
	__u32 line_rate_kbps;
	__u32 min_rate_kbps;
	__u32 ai_rate_kbps;
	__u32 hai_rate_kbps;
	__u32 g;		/* 1/1024 units */
	__u32 threshold;	/* F */
	__u64 alpha_timer_ns;	/* K */
	__u64 increase_timer_ns;	/* T */
	__u64 byte_reset;	/* B */
	__u64 cnp_interval_ns;	/* N */
	__u64 cut_interval_ns;
	__u32 cnp_dscp;
	__u32 ifindex;		/* this device: where the CNP clone goes */
};

struct qp_peer {
	__u32 rqpn;
	__u32 peer_ip;		/* network order */
};

struct rp_key {
	__u32 peer_ip;		/* network order */
	__u32 rqpn;
};

struct rp_state {
	struct bpf_spin_lock lock;
	__u32 started;
	__u32 rc_kbps;
	__u32 rt_kbps;
	__u32 alpha;		/* Q20 */
	__u32 t_count;
	__u32 bc_count;
	__u32 has_cut;
	__u64 now_ns;
	__u64 alpha_t0_ns;
	__u64 inc_t0_ns;
	__u64 last_cut_ns;
	__u64 next_tx_ns;
	__u64 bytes_since;
	__u64 cnp_received;
	__u64 cnp_ignored;
	__u64 rate_cuts;
	__u64 dropped_events;
};

/* The first 12 bytes after UDP: opcode, flags, P_Key, reserved (FECN/BECN bits), destination QP (24 bits),
 * AckReq + reserved, PSN (24 bits). */
struct bth {
	__u8 opcode;
	__u8 flags;
	__u16 pkey;
	__u8 resv;
	__u8 dqpn[3];
	__u8 ack;
	__u8 psn[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dcqcn_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct qp_peer);
} qpmap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct rp_key);
	__type(value, struct rp_state);
} rp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} np_last SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, S_NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 i, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);

	if (v)
		__sync_fetch_and_add(v, n);
}

/* ---- the RP state machine (traffic/dcqcn.py: ReactionPoint) ------------------------------------------------ */

static __always_inline __u32 alpha_decay(__u32 alpha, __u32 g, __u64 n)
{
	__u64 factor = (__u64)(G_UNIT - g) << 10, result = ALPHA_ONE;
	int i;

	for (i = 0; i < 32; i++) {
		if (n == 0)
			break;
		if (n & 1)
			result = result * factor >> 20;
		factor = factor * factor >> 20;
		n >>= 1;
	}
	if (n)
		return 0;
	return (__u64)alpha * result >> 20;
}

static __always_inline void increase_one(struct rp_state *s, const struct dcqcn_config *c, int timer)
{
	__u32 mx, mn, d, rt;

	if (timer)
		s->t_count++;
	else
		s->bc_count++;
	mx = s->t_count > s->bc_count ? s->t_count : s->bc_count;
	mn = s->t_count < s->bc_count ? s->t_count : s->bc_count;
	d = mx <= c->threshold ? 0 : (mn > c->threshold ? c->hai_rate_kbps : c->ai_rate_kbps);
	rt = s->rt_kbps + d;
	s->rt_kbps = rt < c->line_rate_kbps ? rt : c->line_rate_kbps;
	s->rc_kbps = (s->rt_kbps + s->rc_kbps + 1) >> 1;
}

/* n rate-increase events of one kind: exact steps, then the settled remainder in closed form (see the model). */
static __always_inline void increase(struct rp_state *s, const struct dcqcn_config *c, __u64 n, int timer)
{
	int round, i;

	for (round = 0; round < MAX_ROUNDS; round++) {
		__u32 count, other, d, e;
		__u64 jump;

		for (i = 0; i < MAX_CATCHUP; i++) {
			if (n == 0)
				return;
			increase_one(s, c, timer);
			n--;
		}
		if (n == 0)
			return;
		count = timer ? s->t_count : s->bc_count;
		other = timer ? s->bc_count : s->t_count;
		if (count < c->threshold)
			break;
		d = other > c->threshold ? c->hai_rate_kbps : c->ai_rate_kbps;
		if (s->rt_kbps >= c->line_rate_kbps)
			d = 0;
		e = s->rt_kbps - s->rc_kbps;
		if (((e + d) >> 1) != e)
			break;
		jump = n;
		if (d && (c->line_rate_kbps - s->rt_kbps - 1) / d < n)
			jump = (c->line_rate_kbps - s->rt_kbps - 1) / d;
		s->rt_kbps += jump * d;
		s->rc_kbps = s->rt_kbps - e;
		if (timer)
			s->t_count += jump;
		else
			s->bc_count += jump;
		n -= jump;
		if (n == 0)
			return;
	}
	s->dropped_events += n;
}

static __always_inline void advance(struct rp_state *s, const struct dcqcn_config *c, __u64 now)
{
	__u64 k, n;

	if (!s->started) {
		s->started = 1;
		s->now_ns = s->alpha_t0_ns = s->inc_t0_ns = s->next_tx_ns = now;
	}
	if (now < s->now_ns)
		now = s->now_ns;
	s->now_ns = now;
	k = (now - s->alpha_t0_ns) / c->alpha_timer_ns;
	if (k) {
		s->alpha = alpha_decay(s->alpha, c->g, k);
		s->alpha_t0_ns += k * c->alpha_timer_ns;
	}
	n = (now - s->inc_t0_ns) / c->increase_timer_ns;
	if (n) {
		s->inc_t0_ns += n * c->increase_timer_ns;
		increase(s, c, n, 1);
	}
}

/* A CNP: 1 when it cut the rate. */
static __always_inline int on_cnp(struct rp_state *s, const struct dcqcn_config *c, __u64 now)
{
	__u32 cut, alpha;

	advance(s, c, now);
	now = s->now_ns;
	s->cnp_received++;
	s->alpha_t0_ns = now;
	if (s->has_cut && now - s->last_cut_ns < c->cut_interval_ns) {
		s->cnp_ignored++;
		return 0;
	}
	s->rt_kbps = s->rc_kbps;
	cut = (__u64)s->rc_kbps * s->alpha >> 21;
	s->rc_kbps = s->rc_kbps - cut > c->min_rate_kbps ? s->rc_kbps - cut : c->min_rate_kbps;
	alpha = ((__u64)s->alpha * (G_UNIT - c->g) >> 10) + (c->g << 10);
	s->alpha = alpha < ALPHA_ONE ? alpha : ALPHA_ONE;
	s->inc_t0_ns = now;
	s->bytes_since = s->t_count = s->bc_count = 0;
	s->last_cut_ns = now;
	s->has_cut = 1;
	s->rate_cuts++;
	return 1;
}

/* A packet of len bytes handed over now: its departure time, and the byte counter's events. */
static __always_inline __u64 departure(struct rp_state *s, const struct dcqcn_config *c, __u64 now, __u32 len)
{
	__u64 t, n;

	advance(s, c, now);
	t = s->now_ns > s->next_tx_ns ? s->now_ns : s->next_tx_ns;
	s->next_tx_ns = t + (__u64)len * 8000000 / (s->rc_kbps ? s->rc_kbps : 1);
	s->bytes_since += len;
	n = s->bytes_since / c->byte_reset;
	s->bytes_since -= n * c->byte_reset;
	if (n)
		increase(s, c, n, 0);
	return t;
}

/* ---- packet parsing and rewriting ------------------------------------------------------------------------ */

static __always_inline __u32 bth_qpn(const struct bth *b)
{
	return ((__u32)b->dqpn[0] << 16) | ((__u32)b->dqpn[1] << 8) | b->dqpn[2];
}

/* The BTH of a RoCEv2 packet over IPv4 without options, or NULL. Headers outside the skb's linear part are
 * pulled in first (a paged skb's linear part may end before the BTH). */
static __always_inline struct bth *roce_bth(struct __sk_buff *skb, struct iphdr **ipp)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct bth *b;

	if (data + sizeof(*eth) + sizeof(*ip) + sizeof(*udp) + sizeof(*b) > end && skb->len >= 54) {
		if (bpf_skb_pull_data(skb, 54))
			return NULL;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
	}
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	b = (void *)(udp + 1);
	if ((void *)(b + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_UDP || udp->dest != bpf_htons(ROCE_V2_PORT))
		return NULL;
	*ipp = ip;
	return b;
}

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* RFC 1624 incremental update of the IPv4 checksum for one 16-bit word changing from old to new. */
static __always_inline void ip_csum_replace(struct iphdr *ip, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~ip->check + (__u16)~old + new;

	ip->check = csum_fold(sum);
}

static __always_inline void np_ce(struct __sk_buff *skb, const struct dcqcn_config *c, struct bth *b, __u64 now)
{
	__u32 qpn = bth_qpn(b);
	__u64 *last;

	count(S_CE_SEEN, 1);
	if (!bpf_map_lookup_elem(&qpmap, &qpn)) {
		count(S_UNKNOWN_QP, 1);
		return;
	}
	last = bpf_map_lookup_elem(&np_last, &qpn);
	if (last && now - *last < c->cnp_interval_ns) {
		count(S_CNP_SUPPRESSED, 1);
		return;
	}
	bpf_map_update_elem(&np_last, &qpn, &now, BPF_ANY);
	skb->mark = CNP_MARK;
	if (bpf_clone_redirect(skb, c->ifindex, 0) != 0)
		count(S_CNP_FAILED, 1);
	skb->mark = 0;
}

SEC("tc")
int dcqcn_ingress(struct __sk_buff *skb)
{
	struct dcqcn_config *c;
	struct rp_state *s;
	struct qp_peer *peer;
	struct rp_key key;
	struct iphdr *ip;
	struct bth *b;
	__u32 zero = 0, qpn;
	__u64 now;
	int cut;

	b = roce_bth(skb, &ip);
	c = bpf_map_lookup_elem(&config, &zero);
	if (!b || !c || !c->alpha_timer_ns || !c->increase_timer_ns || !c->byte_reset)
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	if (b->opcode != BTH_OPCODE_CNP) {
		if ((ip->tos & 3) == 3)
			np_ce(skb, c, b, now);
		return TC_ACT_OK;
	}
	qpn = bth_qpn(b);
	peer = bpf_map_lookup_elem(&qpmap, &qpn);
	if (!peer || peer->peer_ip != ip->saddr) {
		count(S_UNKNOWN_QP, 1);
		return TC_ACT_SHOT;
	}
	key.peer_ip = peer->peer_ip;
	key.rqpn = peer->rqpn;
	s = bpf_map_lookup_elem(&rp, &key);
	if (!s) {
		count(S_UNKNOWN_QP, 1);
		return TC_ACT_SHOT;
	}
	bpf_spin_lock(&s->lock);
	cut = on_cnp(s, c, now);
	bpf_spin_unlock(&s->lock);
	count(S_CNP_RECEIVED, 1);
	count(cut ? S_RATE_CUTS : S_CNP_IGNORED, 1);
	return TC_ACT_SHOT;
}

/* The CNP's IPv4 header, from the CE packet's: addresses swapped, the CNP DSCP without ECN, a fresh checksum. */
static __always_inline void cnp_ip(struct iphdr *ip, __u32 dscp)
{
	__u32 addr = ip->saddr, sum = 0, i;
	__u16 *w = (void *)ip;

	ip->saddr = ip->daddr;
	ip->daddr = addr;
	ip->tos = (dscp & 0x3f) << 2;	/* not ECN-capable */
	ip->tot_len = bpf_htons(CNP_LEN - 14);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000);	/* DF */
	ip->ttl = 64;
	ip->check = 0;
	for (i = 0; i < 10; i++)
		sum += w[i];
	ip->check = csum_fold(sum);
}

/* The CE packet's clone, rewritten in place into a CNP for the QP that sent it. */
static __always_inline int make_cnp(struct __sk_buff *skb, const struct dcqcn_config *c)
{
	void *data, *end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct bth *b;
	struct qp_peer *peer;
	__u8 mac[ETH_ALEN], *tail;
	__u32 qpn, i;

	b = roce_bth(skb, &ip);
	if (!b)
		return -1;
	qpn = bth_qpn(b);
	peer = bpf_map_lookup_elem(&qpmap, &qpn);
	if (!peer)
		return -1;
	qpn = peer->rqpn;
	if (bpf_skb_change_tail(skb, CNP_LEN, 0))
		return -1;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	b = (void *)(udp + 1);
	tail = (void *)(b + 1);
	if ((void *)(tail + 20) > end)
		return -1;
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	cnp_ip(ip, c->cnp_dscp);
	udp->dest = bpf_htons(ROCE_V2_PORT);
	udp->len = bpf_htons(CNP_LEN - 14 - 20);
	udp->check = 0;
	b->opcode = BTH_OPCODE_CNP;
	b->flags = 0;
	b->pkey = bpf_htons(0xffff);
	b->resv = 0x40;	/* BECN (to check against the CNP format of RoCEv2, Annex A17) */
	b->dqpn[0] = qpn >> 16;
	b->dqpn[1] = qpn >> 8;
	b->dqpn[2] = qpn;
	b->ack = 0;
	b->psn[0] = b->psn[1] = b->psn[2] = 0;
	for (i = 0; i < 20; i++)	/* 16 reserved bytes and the ICRC (not computed) */
		tail[i] = 0;
	skb->tstamp = 0;
	skb->mark = 0;
	return 0;
}

SEC("tc")
int dcqcn_egress(struct __sk_buff *skb)
{
	struct dcqcn_config *c;
	struct rp_state *s;
	struct rp_key key;
	struct iphdr *ip;
	struct bth *b;
	__u32 zero = 0;
	__u64 now, t;

	c = bpf_map_lookup_elem(&config, &zero);
	if (!c || !c->alpha_timer_ns || !c->increase_timer_ns || !c->byte_reset)
		return TC_ACT_OK;
	if (skb->mark == CNP_MARK) {
		if (make_cnp(skb, c)) {
			count(S_CNP_FAILED, 1);
			return TC_ACT_SHOT;
		}
		count(S_CNP_SENT, 1);
		return TC_ACT_OK;
	}
	b = roce_bth(skb, &ip);
	if (!b || b->opcode == BTH_OPCODE_CNP)
		return TC_ACT_OK;
	/* ECT(0) on every RoCE packet, as a NIC with RoCE congestion control on the priority sends: also before the
	 * QP is mapped (a Not-ECT packet is dropped, not marked, by a RED queue above its threshold) */
	if ((ip->tos & 3) == 0) {
		__u16 old = *(__u16 *)ip;

		ip->tos |= 2;
		ip_csum_replace(ip, old, *(__u16 *)ip);
	}
	key.peer_ip = ip->daddr;
	key.rqpn = bth_qpn(b);
	s = bpf_map_lookup_elem(&rp, &key);
	if (!s)
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	bpf_spin_lock(&s->lock);
	t = departure(s, c, now, skb->len);
	bpf_spin_unlock(&s->lock);
	skb->tstamp = t;
	count(S_PACED, 1);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
