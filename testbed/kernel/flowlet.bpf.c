// SPDX-License-Identifier: GPL-2.0
/* Flowlet load balancing on a leaf's uplinks: LetFlow (a new flowlet takes a random uplink) and, with congestion
 * feedback, CONGA-style adaptive choice (a new flowlet takes the uplink whose path to the destination's leaf is the
 * least congested). Runs on the clsact egress hook of every uplink of one router, after the kernel's ECMP route
 * chose a port: a packet that belongs to a live flowlet follows that flowlet's port; the first packet after a gap of
 * more than gap_ns starts a new flowlet and picks its port. A packet moved to another uplink is marked so the hook
 * there lets it through (the mark does not cross the veth into the next namespace). The far ends of the uplinks
 * share one MAC (an anycast gateway MAC), so a moved frame needs no rewrite. Only IPv4 is balanced: ARP leaves by the
 * port its route chose.
 *
 * The adaptive choice weighs each uplink by the larger of two delays, in microseconds (CONGA's path metric, the
 * maximum along the path):
 *   local  the bytes this router sent up the uplink lately (a discounting rate estimator: halved every
 *          dre_half_life_ns, as CONGA's DRE decays) plus the newcomer's own first burst (join_bytes: a new TCP
 *          flow's initial window), times the time one byte takes at the uplink's rate: updated by every packet, so
 *          flowlets that start together see each other's choices, and an idle slow uplink is not preferred to a
 *          fast one that would still send the newcomer's burst sooner;
 *   remote the time the most backlogged queue on the path (the uplink's and the spine's port toward the
 *          destination's leaf) needs to drain, written every poll by the controller (testbed/loadbalance.py).
 *
 * Maps (filled and read by testbed/kernel/flowlet.py):
 *   config   [0] gap_ns, nports, adaptive, dre_half_life_ns, join_bytes
 *   ports    uplink index -> ifindex
 *   tx_ps    uplink index -> picoseconds one byte takes at the uplink's rate (written by the controller)
 *   dre      uplink index -> (bytes, time of the last decay): the local rate estimator
 *   dst_slot destination IPv4 (network order) -> destination slot (its leaf)
 *   cong     slot * MAX_PORTS + uplink -> the remote delay of that path in us, written by the controller
 *   flows    5-tuple -> (last packet time, uplink): the flowlet table
 *   stats    0 flowlets started, 1 packets moved, 2 packets balanced
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_PORTS 8
#define MAX_SLOTS 64
#define LB_MARK 0x5A7B

struct config {
	__u64 gap_ns;
	__u32 nports;
	__u32 adaptive;
	__u64 dre_half_life_ns;
	__u64 join_bytes;
};

struct dre {
	__u64 bytes;
	__u64 t_ns;
};

struct flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u32 proto;
};

struct flowlet {
	__u64 last_ns;
	__u32 port;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} tx_ps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, struct dre);
} dre SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} dst_slot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS * MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} cong SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_key);
	__type(value, struct flowlet);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* The estimator of one uplink, decayed to now (halved per elapsed half-life). */
static __always_inline struct dre *dre_at(__u32 port, __u64 now, __u64 half_life)
{
	struct dre *d = bpf_map_lookup_elem(&dre, &port);
	__u64 n;

	if (!d || !half_life)
		return d;
	if (now > d->t_ns + half_life) {
		n = (now - d->t_ns) / half_life;
		d->bytes = n >= 64 ? 0 : d->bytes >> n;
		d->t_ns += n * half_life;
	}
	return d;
}

/* The uplink's local delay in us for a newcomer: its recent bytes plus the newcomer's first burst, at its rate. */
static __always_inline __u64 local_us(__u32 port, __u64 now, const struct config *cfg)
{
	struct dre *d = dre_at(port, now, cfg->dre_half_life_ns);
	__u32 *ps = bpf_map_lookup_elem(&tx_ps, &port);

	if (!d || !ps)
		return 0;
	return (d->bytes + cfg->join_bytes) * *ps / 1000000;
}

/* A random uplink (LetFlow); with adaptive, the path with the smallest max(local, remote) delay, ties broken by the
 * random start so equal paths share the flowlets. */
static __always_inline __u32 choose(const struct config *cfg, __u32 daddr, __u64 now)
{
	__u32 n = cfg->nports, start = bpf_get_prandom_u32() % n, best = start, i;
	__u32 *slot, key, *c;
	__u64 best_m = ~0ULL, m;

	if (!cfg->adaptive)
		return start;
	slot = bpf_map_lookup_elem(&dst_slot, &daddr);
	for (i = 0; i < MAX_PORTS; i++) {
		__u32 j;

		if (i >= n)
			break;
		j = (start + i) % n;
		m = local_us(j, now, cfg);
		if (slot && *slot < MAX_SLOTS) {
			key = *slot * MAX_PORTS + j;
			c = bpf_map_lookup_elem(&cong, &key);
			if (c && *c > m)
				m = *c;
		}
		if (m < best_m) {
			best_m = m;
			best = j;
		}
	}
	return best;
}

SEC("tc")
int flowlet_lb(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct flow_key k = {};
	struct flowlet *f, nf = {};
	struct config *cfg;
	struct iphdr *ip;
	__u32 zero = 0, port, *ifx;
	__u64 now;

	if (skb->mark == LB_MARK)
		return TC_ACT_OK;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return TC_ACT_OK;
	cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->nports < 2 || cfg->nports > MAX_PORTS)
		return TC_ACT_OK;
	k.saddr = ip->saddr;
	k.daddr = ip->daddr;
	k.proto = ip->protocol;
	if (ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) {
		__u16 *l4 = (void *)ip + ip->ihl * 4;

		if ((void *)(l4 + 2) <= end) {
			k.sport = l4[0];
			k.dport = l4[1];
		}
	}
	count(2);
	now = bpf_ktime_get_ns();
	f = bpf_map_lookup_elem(&flows, &k);
	if (f && now - f->last_ns < cfg->gap_ns) {
		f->last_ns = now;
		port = f->port;
	} else {
		port = choose(cfg, k.daddr, now);
		nf.last_ns = now;
		nf.port = port;
		bpf_map_update_elem(&flows, &k, &nf, BPF_ANY);
		count(0);
	}
	if (port < MAX_PORTS) {
		struct dre *d = dre_at(port, now, cfg->dre_half_life_ns);

		if (d)
			__sync_fetch_and_add(&d->bytes, skb->len);
	}
	ifx = bpf_map_lookup_elem(&ports, &port);
	if (!ifx || *ifx == 0 || *ifx == skb->ifindex)
		return TC_ACT_OK;
	skb->mark = LB_MARK;
	count(1);
	return bpf_redirect(*ifx, 0);
}

char LICENSE[] SEC("license") = "GPL";
