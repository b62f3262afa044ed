// SPDX-License-Identifier: GPL-2.0
/* Packet trimming at a switch port (UEC 1.0: a switch that would drop a packet for lack of buffer forwards its
 * headers instead, so the receiver learns of the loss at once and NACKs it). Runs on the clsact egress hook of one
 * port, before the port's HTB and leaf queue: when the port's queue is above a threshold, a UET data packet (UDP to
 * the UET port or one of the 15 above it, header magic 0x55, type DATA, traffic/uet_packet.py) is cut to Ethernet +
 * IPv4 + UDP + its 72-byte header, FLAG_TRIMMED is set in the header and skb->priority is set to the port's
 * high-priority class (HTB takes a priority of the form <its handle>:<minor> as the class), so the trimmed header
 * does not wait behind the data.
 * The trimmed packet is redirected to the port's own egress (see uet_trim): the qdisc's idea of its length was taken
 * before this hook and would still be the untrimmed one.
 *
 * The queue. A tc program cannot read the qdisc's backlog (the skb has not been enqueued yet, and no helper exposes
 * a qdisc's qstats), and a user-space sampler polling the backlog over netlink is milliseconds late, when a shallow
 * port fills in a few packet times. So the program keeps a virtual queue of the port: every packet adds its length
 * (after trimming, the trimmed length) unless the port's buffer (buffer_bytes, the leaf queue's limit, written by
 * the loader) has no room for it, as the real queue drops it, and the port drains it at its configured rate
 * (bytes = elapsed time / the time one byte takes, ps_per_byte, written by the loader from the port's HTB rate).
 * It equals the real backlog as long as the port sends at its configured rate whenever it has something to send,
 * which is what HTB does for a single-rate port. Drained any slower, it would grow by the difference under
 * sustained full-rate load and never empty: every UET packet would then be trimmed. A port sending below its rate
 * (HTB's watchdog late on a busy machine) has a real queue above the virtual one: it trims late, and its buffer
 * may drop.
 *
 * A port whose rate changes at run time (a slow-port fault, testbed.faults.timeline) gets its new rate written by
 * the loader too, with the old one and the moment of the change (prev_ps_per_byte, rate_since_ns): the time
 * between the queue's last update and the change drains at the old rate, the time after it at the new one, so the
 * queue is not off by the gap to the first packet after the change times the difference of the rates.
 *
 * Maps (filled and read by testbed/kernel/trim.py):
 *   config  [0] ps_per_byte, threshold_bytes, uet_port (host order), trim_priority (0: leave skb->priority),
 *           buffer_bytes, prev_ps_per_byte and rate_since_ns (the rate before the last change, and the change's
 *           bpf_ktime_get_ns: CLOCK_MONOTONIC; 0 and 0 before any change)
 *   vq      [0] virtual queue: bytes, time of the last update, peak bytes; under a spin lock (the port's egress
 *           runs on every CPU)
 *   stats   0 packets, 1 UET data packets, 2 trimmed packets, 3 bytes cut, 4 UET data packets too short to trim
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define UET_HEADER_BYTES 72
#define UET_MAGIC 0x55
#define UET_TYPE_DATA 1
#define UET_FLAG_TRIMMED 0x01
#define L2L3L4_BYTES (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))
#define TRIMMED_BYTES (L2L3L4_BYTES + UET_HEADER_BYTES)
#define IP_OFF sizeof(struct ethhdr)
#define UDP_OFF (IP_OFF + sizeof(struct iphdr))
#define UET_OFF (UDP_OFF + sizeof(struct udphdr))
#define NSTATS 5
#define UET_PORT_SPAN 16 /* traffic/uet_packet.py PORT_SPAN: ranks sharing a host listen on the next ports */

struct config {
	__u64 ps_per_byte;
	__u64 threshold_bytes;
	__u32 uet_port;
	__u32 trim_priority;
	__u64 buffer_bytes;
	__u64 prev_ps_per_byte;
	__u64 rate_since_ns;
};

struct vqueue {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 bytes;
	__u64 t_ns;
	__u64 peak_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vqueue);
} vq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 i, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);

	if (v)
		__sync_fetch_and_add(v, n);
}

/* Is this an untrimmed UET data packet with a payload to cut? Reads only the linear head. */
static __always_inline int uet_data(struct __sk_buff *skb, const struct config *cfg)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	struct udphdr *udp = data + UDP_OFF;
	__u8 *uet = data + UET_OFF;

	if (data + UET_OFF + 3 > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return 0;
	if (ip->frag_off & bpf_htons(0x3FFF))
		return 0;
	if (bpf_ntohs(udp->dest) - cfg->uet_port >= UET_PORT_SPAN) /* unsigned: below the port wraps */
		return 0;
	if (uet[0] != UET_MAGIC || uet[1] != UET_TYPE_DATA || (uet[2] & UET_FLAG_TRIMMED))
		return 0;
	return 1;
}

/* Cut the packet to its headers: change the tail, then the IPv4 total length (and checksum), the UDP length (and a
 * zero checksum: none, allowed over IPv4) and the UET flags. 0 on success. The sender sends no UDP checksum either
 * (SO_NO_CHECK, traffic/uet.py): a checksum the kernel left partial, for a later device to fill in, would be filled
 * in over the cut packet wrong. */
static __always_inline int trim(struct __sk_buff *skb)
{
	__u16 old_tot, new_tot = bpf_htons(TRIMMED_BYTES - IP_OFF), udp_len = bpf_htons(TRIMMED_BYTES - UDP_OFF);
	__u16 zero = 0;
	__u8 flags;

	if (bpf_skb_load_bytes(skb, IP_OFF + 2, &old_tot, 2) || bpf_skb_load_bytes(skb, UET_OFF + 2, &flags, 1))
		return -1;
	if (bpf_skb_change_tail(skb, TRIMMED_BYTES, 0))
		return -1;
	flags |= UET_FLAG_TRIMMED;
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, old_tot, new_tot, 2))
		return -1;
	if (bpf_skb_store_bytes(skb, IP_OFF + 2, &new_tot, 2, 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFF + 4, &udp_len, 2, 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFF + 6, &zero, 2, 0) ||
	    bpf_skb_store_bytes(skb, UET_OFF + 2, &flags, 1, 0))
		return -1;
	return 0;
}

/* Bytes the port sent between `from` and `now` (ns): at the rate before the last change up to the change, at the
 * current rate after it. */
static __always_inline __u64 drained_bytes(const struct config *cfg, __u64 from, __u64 now)
{
	__u64 out = 0, until;

	if (cfg->rate_since_ns > from && cfg->prev_ps_per_byte) {
		until = cfg->rate_since_ns < now ? cfg->rate_since_ns : now;
		out = (until - from) * 1000 / cfg->prev_ps_per_byte;
		from = until;
	}
	return out + (now - from) * 1000 / cfg->ps_per_byte;
}

SEC("tc")
int uet_trim(struct __sk_buff *skb)
{
	__u32 zero = 0, len = skb->len, is_data;
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	struct vqueue *q = bpf_map_lookup_elem(&vq, &zero);
	__u64 now, drained, backlog;

	if (!cfg || !q || cfg->ps_per_byte == 0)
		return TC_ACT_OK;
	count(0, 1);
	is_data = uet_data(skb, cfg);
	if (is_data)
		count(1, 1);
	now = bpf_ktime_get_ns();
	bpf_spin_lock(&q->lock);
	if (now > q->t_ns) {
		drained = drained_bytes(cfg, q->t_ns, now);
		q->bytes = q->bytes > drained ? q->bytes - drained : 0;
		q->t_ns = now;
	}
	backlog = q->bytes;
	/* a packet to trim is counted when it comes back trimmed (below); the others with their whole length, unless
	 * the port's buffer has no room for them (the real queue drops them: they never take the wire) */
	if (!(is_data && backlog >= cfg->threshold_bytes && len > TRIMMED_BYTES) &&
	    q->bytes + len <= cfg->buffer_bytes)
		q->bytes += len;
	if (q->bytes > q->peak_bytes)
		q->peak_bytes = q->bytes;
	bpf_spin_unlock(&q->lock);
	if (!is_data || backlog < cfg->threshold_bytes)
		return TC_ACT_OK;
	if (len <= TRIMMED_BYTES) {
		count(4, 1);
		return TC_ACT_OK;
	}
	if (trim(skb))
		return TC_ACT_SHOT; /* half-rewritten: better lost (the sender's timer recovers it) than corrupt */
	if (cfg->trim_priority)
		skb->priority = cfg->trim_priority;
	count(2, 1);
	count(3, len - TRIMMED_BYTES);
	/* The kernel took the packet's length for the qdisc (qdisc_pkt_len_init) before this hook ran: enqueued now,
	 * the header would be shaped as the whole packet. Sent to the port's egress again, it is measured anew (and
	 * passes this program untouched: it is flagged trimmed). */
	return bpf_redirect(skb->ifindex, 0);
}

char LICENSE[] SEC("license") = "GPL";
