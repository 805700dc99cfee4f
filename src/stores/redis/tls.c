/*
 * Redis over TLS (rediss://, or tls=yes on redlock:// and redis+sentinel://):
 * hiredis 0.14 has no TLS, so its contexts keep doing what they do well —
 * connecting the TCP socket, building commands in their output buffer and
 * parsing replies with their redisReader — while the bytes go through an
 * OpenSSL session on that socket. Every write of a context goes through
 * dlock__rbuffer_write and every read through dlock__rbuffer_read, which
 * ask here whether the context has a session (a small table, looked up
 * only while some context has one).
 */
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <hiredis/sds.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

struct dlock__rtls {
	SSL_CTX *ctx;
	char *name; /* sni=: the name to send and check instead of each server's host */
	bool insecure;
};

/* ---- options ---- */

static int tls_fail(const char *kind, const char *what)
{
	unsigned long e = ERR_get_error();
	char buf[256] = "";
	if (e)
		ERR_error_string_n(e, buf, sizeof(buf));
	ERR_clear_error();
	return dlock_error_set(DLOCK_EINVAL, kind, "TLS", "%s%s%s", what, buf[0] ? ": " : "", buf);
}

int dlock__rtls_parse(dlock__rtls **out, dlock_uri *uri, const char *kind)
{
	*out = NULL;
	const char *tls = dlock_uri_param(uri, "tls");
	const char *cacert = dlock_uri_param(uri, "cacert"), *cert = dlock_uri_param(uri, "cert");
	const char *key = dlock_uri_param(uri, "key"), *sni = dlock_uri_param(uri, "sni");
	const char *insecure = dlock_uri_param(uri, "insecure");
	bool on = !strcmp(uri->scheme, "rediss") || !strcmp(uri->scheme, "rediss+cluster");
	if (tls && strcmp(tls, "yes") != 0 && strcmp(tls, "no") != 0)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "option tls: want yes or no, not '%s'", tls);
	if (tls && !strcmp(tls, "no") && on)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "%s:// is TLS: tls=no contradicts it", uri->scheme);
	on |= tls && !strcmp(tls, "yes");
	if (!on) {
		if (cacert || cert || key || sni || insecure)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL,
					       "cacert, cert, key, sni and insecure need TLS: rediss://, or tls=yes");
		return 0;
	}
	/* Turning the check off must be said in so many words. */
	if (insecure && strcmp(insecure, "yes-i-know") != 0)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL,
				       "option insecure: the server's certificate would not be checked, so anyone "
				       "on the path could pose as the server; say insecure=yes-i-know to mean it");
	if (!cert != !key)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "cert and key go together (mutual TLS)");
	dlock__rtls *t = dlock_sys_calloc(1, sizeof(*t));
	if (!t)
		return DLOCK_ENOMEM;
	t->insecure = insecure != NULL;
	if (t->insecure)
		dlock_sys_open_warning(
			"%s: insecure=yes-i-know: the server's certificate is not checked; anyone on "
			"the path can pose as the server and read the password and the lock traffic",
			kind);
	int rc = 0;
	if (sni && !(t->name = dlock_sys_strdup(sni))) {
		rc = DLOCK_ENOMEM;
		goto fail;
	}
	if (!(t->ctx = SSL_CTX_new(TLS_client_method()))) {
		rc = tls_fail(kind, "TLS: cannot make a context");
		goto fail;
	}
	SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
	/* hiredis moves its output buffer between writes */
	SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_verify(t->ctx, t->insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
	if (cacert ? SSL_CTX_load_verify_locations(t->ctx, cacert, NULL) != 1
		   : SSL_CTX_set_default_verify_paths(t->ctx) != 1) {
		rc = tls_fail(kind,
			      cacert ? "TLS: cannot read the CA certificates of cacert" : "TLS: no system CA store");
		goto fail;
	}
	if (cert && (SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1 ||
		     SSL_CTX_use_PrivateKey_file(t->ctx, key, SSL_FILETYPE_PEM) != 1 ||
		     SSL_CTX_check_private_key(t->ctx) != 1)) {
		rc = tls_fail(kind, "TLS: cannot use the client certificate (cert=, key=)");
		goto fail;
	}
	*out = t;
	return 0;
fail:
	dlock__rtls_free(t);
	return rc;
}

void dlock__rtls_free(dlock__rtls *t)
{
	if (!t)
		return;
	SSL_CTX_free(t->ctx);
	free(t->name);
	free(t);
}

void dlock__rservers_free(dlock__rserver *s)
{
	if (s && s[0].tls_owner)
		dlock__rtls_free(s[0].tls);
	free(s);
}

/* ---- which context has a session ---- */

typedef struct tls_conn {
	struct tls_conn *next;
	const redisContext *c;
	SSL *ssl;
} tls_conn;

static pthread_mutex_t conns_mu = PTHREAD_MUTEX_INITIALIZER;
static tls_conn *conns;
static atomic_int nconns; /* plain connections look nothing up while it is 0 */

static SSL *ssl_of(const redisContext *c)
{
	if (atomic_load_explicit(&nconns, memory_order_acquire) == 0)
		return NULL;
	SSL *ssl = NULL;
	pthread_mutex_lock(&conns_mu);
	for (tls_conn *t = conns; t && !ssl; t = t->next)
		if (t->c == c)
			ssl = t->ssl;
	pthread_mutex_unlock(&conns_mu);
	return ssl;
}

void dlock__rfree(redisContext *c)
{
	if (!c)
		return;
	SSL *ssl = NULL;
	if (atomic_load_explicit(&nconns, memory_order_acquire) > 0) {
		pthread_mutex_lock(&conns_mu);
		for (tls_conn **p = &conns; *p; p = &(*p)->next)
			if ((*p)->c == c) {
				tls_conn *t = *p;
				*p = t->next;
				ssl = t->ssl;
				free(t);
				atomic_fetch_sub(&nconns, 1);
				break;
			}
		pthread_mutex_unlock(&conns_mu);
	}
	SSL_free(ssl); /* no close_notify: it could block; the server sees the socket close */
	redisFree(c);
}

/* ---- the handshake ---- */

static bool is_ip(const char *host)
{
	unsigned char buf[16];
	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static void tls_register(redisContext *c, SSL *ssl, tls_conn *tc)
{
	tc->c = c;
	tc->ssl = ssl;
	pthread_mutex_lock(&conns_mu);
	tc->next = conns;
	conns = tc;
	atomic_fetch_add(&nconns, 1);
	pthread_mutex_unlock(&conns_mu);
}

int dlock__rtls_begin(redisContext *c, const dlock__rserver *srv)
{
	const dlock__rtls *t = srv->tls;
	if (!t)
		return 0;
	const char *name = t->name ? t->name : srv->host;
	SSL *ssl = SSL_new(t->ctx);
	tls_conn *tc = calloc(1, sizeof(*tc));
	if (!ssl || !tc) {
		SSL_free(ssl);
		free(tc);
		return dlock_sys_oom();
	}
	SSL_set_fd(ssl, c->fd);
	SSL_set_connect_state(ssl);
	if (!is_ip(name))
		SSL_set_tlsext_host_name(ssl, name); /* SNI is for DNS names only */
	if (!t->insecure) {
		X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
		if (is_ip(name))
			X509_VERIFY_PARAM_set1_ip_asc(vp, name);
		else
			X509_VERIFY_PARAM_set1_host(vp, name, 0);
	}
	int fl = fcntl(c->fd, F_GETFL);
	if (fl >= 0)
		fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
	tls_register(c, ssl, tc); /* dlock__rfree frees the session from now on */
	return 0;
}

int dlock__rtls_step(redisContext *c, const dlock__rserver *srv, const char *kind, short *events)
{
	SSL *ssl = ssl_of(c);
	if (!ssl)
		return 0;
	ERR_clear_error();
	dlock_sys_nopipe np;
	dlock_sys_nopipe_begin(&np);
	int r = SSL_connect(ssl);
	dlock_sys_nopipe_end(&np);
	if (r == 1)
		return 0;
	int e = SSL_get_error(ssl, r);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		*events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
		return 1;
	}
	const char *name = srv->tls->name ? srv->tls->name : srv->host;
	long v = SSL_get_verify_result(ssl);
	unsigned long ee = ERR_peek_last_error();
	char buf[256] = "";
	if (ee)
		ERR_error_string_n(ee, buf, sizeof(buf));
	ERR_clear_error();
	if (v != X509_V_OK)
		return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "TLS",
				       "%s %s:%d: TLS: the server's certificate is not trusted: %s (as %s)", kind,
				       srv->host, srv->port, X509_verify_cert_error_string(v), name);
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "TLS", "%s %s:%d: TLS handshake failed: %s", kind, srv->host,
			       srv->port,
			       buf[0]                   ? buf
			       : e == SSL_ERROR_SYSCALL ? "the connection was closed"
							: "no reason given");
}

static int tls_timed_out(const dlock__rserver *srv, const char *kind)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "ETIMEDOUT", "%s %s:%d: TLS handshake timed out", kind,
			       srv->host, srv->port);
}

int dlock__rtls_connect(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline)
{
	if (!srv->tls)
		return 0;
	int fl = fcntl(c->fd, F_GETFL);
	/* the handshake on a non-blocking socket, each wait bounded by the deadline */
	int rc = dlock__rtls_begin(c, srv);
	while (!rc) {
		short ev = 0;
		int r = dlock__rtls_step(c, srv, kind, &ev);
		if (r <= 0) {
			rc = r;
			break;
		}
		int64_t left = dlock__rms_left(deadline);
		if (left <= 0) {
			rc = tls_timed_out(srv, kind);
			break;
		}
		struct pollfd p = { c->fd, ev, 0 };
		if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR) {
			rc = tls_timed_out(srv, kind);
			break;
		}
	}
	if (fl >= 0)
		fcntl(c->fd, F_SETFL, fl);
	return rc; /* on failure the caller's dlock__rfree frees the session */
}

/* ---- bytes ---- */

static int io_fail(redisContext *c, int err, const char *what)
{
	c->err = err;
	snprintf(c->errstr, sizeof(c->errstr), "%.*s", (int)sizeof(c->errstr) - 1, what);
	return REDIS_ERR;
}

/* A would-block on a blocking socket is its timeout (SO_RCVTIMEO/SO_SNDTIMEO), as hiredis says it. */
static int would_block(redisContext *c)
{
	if (c->flags & REDIS_BLOCK)
		return io_fail(c, REDIS_ERR_IO, "Resource temporarily unavailable");
	return REDIS_OK;
}

static int ssl_fail(redisContext *c, SSL *ssl, int r)
{
	int e = SSL_get_error(ssl, r);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
		return would_block(c);
	if (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return would_block(c);
	if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && r == 0))
		return io_fail(c, REDIS_ERR_EOF, "Server closed the connection");
	unsigned long ee = ERR_get_error();
	char why[128], buf[192];
	if (ee)
		ERR_error_string_n(ee, why, sizeof(why)); /* not ERR_error_string(ee, NULL): a static buffer */
	else
		snprintf(why, sizeof(why), "%s", strerror(errno));
	/* a server that requires a client certificate we did not send closes so */
	snprintf(buf, sizeof(buf), "TLS: %s%s", why,
		 SSL_get_certificate(ssl) ? "" : " (no client certificate was offered: cert=, key=)");
	ERR_clear_error();
	return io_fail(c, REDIS_ERR_IO, buf);
}

/* `n` bytes of the output buffer went out: drop them; *done when none is left. */
static int obuf_sent(redisContext *c, size_t n, int *done)
{
	if (n == sdslen(c->obuf)) {
		sdsfree(c->obuf);
		if (!(c->obuf = sdsempty()))
			return io_fail(c, REDIS_ERR_OOM, "Out of memory");
	} else {
		sdsrange(c->obuf, (ssize_t)n, -1);
	}
	*done = sdslen(c->obuf) == 0;
	return REDIS_OK;
}

static int tls_write(redisContext *c, SSL *ssl, int *done)
{
	if (c->err)
		return REDIS_ERR;
	*done = 0;
	size_t len = sdslen(c->obuf);
	if (len > 0) {
		ERR_clear_error();
		int n = SSL_write(ssl, c->obuf, len > INT32_MAX ? INT32_MAX : (int)len);
		if (n <= 0)
			return ssl_fail(c, ssl, n);
		return obuf_sent(c, (size_t)n, done);
	}
	*done = 1;
	return REDIS_OK;
}

/* hiredis's redisBufferWrite, with send(MSG_NOSIGNAL) instead of write(2):
 * a server gone fails the write (EPIPE) without raising SIGPIPE, and no
 * signal mask has to be set and read around it (three system calls per
 * request, most of the client's CPU on an uncontended lock). */
static int plain_write(redisContext *c, int *done)
{
	if (c->err)
		return REDIS_ERR;
	*done = 0;
	size_t len = sdslen(c->obuf);
	if (len > 0) {
		ssize_t n = send(c->fd, c->obuf, len, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR || ((errno == EAGAIN || errno == EWOULDBLOCK) && !(c->flags & REDIS_BLOCK)))
				return REDIS_OK; /* again later */
			return io_fail(c, REDIS_ERR_IO, strerror(errno));
		}
		return obuf_sent(c, (size_t)n, done);
	}
	*done = 1;
	return REDIS_OK;
}

/* OpenSSL writes with write(2): a server gone raises SIGPIPE, which must
 * fail the write (EPIPE), not kill the program. */
int dlock__rbuffer_write(redisContext *c, int *done)
{
	SSL *ssl = ssl_of(c);
	if (!ssl)
		return plain_write(c, done);
	dlock_sys_nopipe np;
	dlock_sys_nopipe_begin(&np);
	int rc = tls_write(c, ssl, done);
	dlock_sys_nopipe_end(&np);
	return rc;
}

int dlock__rtls_read(redisContext *c, bool *tls)
{
	SSL *ssl = ssl_of(c);
	*tls = ssl != NULL;
	if (!ssl)
		return REDIS_OK;
	if (c->err)
		return REDIS_ERR;
	char buf[16 * 1024];
	/* what OpenSSL already decrypted counts as read: poll would not see it */
	do {
		ERR_clear_error();
		dlock_sys_nopipe np; /* TLS 1.3 may answer a key update while reading */
		dlock_sys_nopipe_begin(&np);
		int n = SSL_read(ssl, buf, sizeof(buf));
		dlock_sys_nopipe_end(&np);
		if (n <= 0)
			return ssl_fail(c, ssl, n);
		if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK)
			return io_fail(c, c->reader->err ? c->reader->err : REDIS_ERR_OOM, c->reader->errstr);
	} while (SSL_pending(ssl) > 0);
	return REDIS_OK;
}
