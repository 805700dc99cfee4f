/* Test-side client of src/tools/faultproxy.c: a TCP proxy put in front of
 * a store's servers to fault the network between the client and them.
 *
 * Modes (per route, applied to open connections and to new ones):
 *   "pass"       forward both ways.
 *   "delay MS"   forward both ways, each chunk MS ms after the proxy read it.
 *   "blackhole"  keep connections open, forward nothing. Bytes that arrive
 *                during blackhole, and bytes still queued in the proxy when
 *                it starts, are DISCARDED (like packets lost on a dead link),
 *                never delivered later; a FIN is held until the direction
 *                flows again. New connections are accepted (the kernel
 *                completes the handshake) but not connected onward until the
 *                route leaves blackhole.
 *   "drop"       forward client->server, discard server->client: the request
 *                is applied, its reply is lost.
 *   "dropmatch STRING"
 *                forward both ways until a request stream (client->server)
 *                contains STRING; from then on that one connection gets no
 *                reply bytes (a "drop" of that connection only: the request
 *                is applied, its answer lost, the connection stays open).
 *                One shot: other and later connections pass. Setting any
 *                mode resets that connection (no later byte after a lost
 *                one, as with TCP). Use it where a
 *                grant is several requests and only the last one's answer
 *                should be lost. See tu_proxy_dropmatch for any bytes.
 *   "reset"      RST both sides of every open connection; new connections
 *                are reset at once.
 * Bytes already handed to the kernel before a mode change may still arrive.
 *
 * The proxy binary is DLOCK_FAULTPROXY (compile definition), overridden by
 * the environment variable DLOCK_FAULTPROXY. The proxy process dies with the
 * thread that called tu_proxy_start (PR_SET_PDEATHSIG): call it from a
 * thread that outlives the proxy, e.g. main. A tu_proxy may be used from
 * several threads (calls are serialised). */
#ifndef DLOCK_TEST_FAULTPROXY_H
#define DLOCK_TEST_FAULTPROXY_H

#include <stddef.h>

typedef struct tu_proxy tu_proxy;

/* Start faultproxy in front of every host:port in the authority of store URI
 * `uri` (scheme://[user[:pass]@]h1:p1[,h2:p2...][/path][?query]; IPv4
 * addresses and "localhost") and set *proxied to a malloc'd copy of `uri`
 * with each host:port replaced by 127.0.0.1:<proxy port>; route i is the
 * i-th host. A host without a port is an error. Returns NULL (message on
 * stderr) on failure; then *proxied is NULL. */
tu_proxy *tu_proxy_start(const char *uri, char **proxied);

/* Set the mode of route `route` (-1 = all routes): "pass", "delay 250",
 * "blackhole", "drop", "dropmatch WORD", "reset". Returns 0 once the proxy has applied it,
 * -1 (message on stderr) on error. */
int tu_proxy_set(tu_proxy *p, int route, const char *mode);

/* Set route `route` (-1 = all) to dropmatch on the `len` bytes at `pattern`
 * (1..128 bytes, any values: they are escaped for the control line). Setting
 * any mode again re-arms it and ends an earlier drop. Returns 0 once applied,
 * -1 (message on stderr) on error. */
int tu_proxy_dropmatch(tu_proxy *p, int route, const void *pattern, size_t len);

/* How many times a dropmatch of route `route` fired since the proxy started
 * (0 or 1 per arming). Returns 0, or -1 (message on stderr). */
int tu_proxy_fired(tu_proxy *p, int route, long long *fired);

/* Counters of route `route`: connections accepted in total, open now, bytes
 * forwarded client->server (up) and server->client (down), bytes discarded.
 * Any out-parameter may be NULL. Returns 0, or -1 (message on stderr). */
int tu_proxy_stats(tu_proxy *p, int route, long long *conns, long long *open, long long *up, long long *down,
		   long long *dropped);

/* Number of routes (hosts in the URI). */
int tu_proxy_routes(const tu_proxy *p);

/* Send quit, wait for the process (SIGKILL after 5 s), remove its control
 * socket, free p. A proxy that exits with a non-zero status (e.g. a leak
 * found by AddressSanitizer) counts as a test failure. Accepts NULL. */
void tu_proxy_stop(tu_proxy *p);

#endif
