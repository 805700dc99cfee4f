/* A small TCP fault proxy for the MySQL and Memcached network tests (see mysql_proxy.c). */
#ifndef DLOCK_TEST_MYSQL_PROXY_H
#define DLOCK_TEST_MYSQL_PROXY_H

#include <stddef.h>

enum { MP_PASS, MP_BLACKHOLE, MP_DROP, MP_DROP_ON };

typedef struct mp_proxy mp_proxy;

/* Listen on a free loopback port and forward to 127.0.0.1:target_port. 0 or -1. */
int mp_start(mp_proxy **out, int target_port);
int mp_port(const mp_proxy *p);
/* Switch mode (MP_*); returns once the proxy runs in it. */
void mp_set(mp_proxy *p, int mode);
/* Forward until the client sends a request containing needle, then MP_DROP
 * (that request is forwarded, its reply and every later one swallowed).
 * An empty needle: MP_DROP at once. */
void mp_drop_on(mp_proxy *p, const char *needle);
/* Reply bytes swallowed so far in MP_DROP. */
long long mp_dropped(const mp_proxy *p);
void mp_stop(mp_proxy *p);
/* uri with its host:port replaced by 127.0.0.1:port. 0 or -1. */
int mp_uri(char *out, size_t size, const char *uri, int port);

#endif
