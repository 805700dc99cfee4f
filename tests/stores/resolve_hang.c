/*
 * Opening a store whose host name the DNS never answers for returns
 * DLOCK_EUNAVAILABLE ("timed out resolving HOST") within the open's timeout
 * + max(50 ms, 5 %), on every store compiled in; and a host name found in
 * /etc/hosts still opens a real server at once, without asking the DNS (over
 * TLS only by a name the certificate carries: the name, not the address, is
 * what TLS checks).
 *
 * The DNS hangs for real: the program moves into a private mount namespace
 * (it must run as root; CI does), bind-mounts a resolv.conf naming a loopback
 * nameserver that this program runs itself (a UDP socket on 127.x.y.z:53
 * that reads queries and never answers), an nsswitch.conf with "hosts: files
 * dns" (as on Debian) and a hosts file of its own. Not root and not in CI
 * (no CI in the environment): skipped (77), saying why. In CI a namespace
 * that cannot be set up is a failure.
 *
 * usage: resolve_hang [STORE=URIFILE ...]   (a URI file of a running server
 * whose host is 127.0.0.1: opened again through a /etc/hosts name)
 */
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OPEN_TIMEOUT_MS 1500
#define HANG_NAME "hang.dlock-test.example"
#define UP_NAME "up.dlock-test.example"

static int dns_fd = -1;
static atomic_int dns_queries, dns_hang_queries, dns_up_queries;
static atomic_bool dns_stop;

/* Does the query name (DNS wire format after the 12-byte header) contain label? */
static bool query_has(const unsigned char *p, size_t n, const char *label)
{
	size_t l = strlen(label);
	for (size_t i = 12; i < n;) {
		size_t len = p[i];
		if (len == 0 || i + 1 + len > n)
			break;
		if (len == l && !memcmp(p + i + 1, label, l))
			return true;
		i += 1 + len;
	}
	return false;
}

static void *dns_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&dns_stop)) {
		struct pollfd p = { dns_fd, POLLIN, 0 };
		if (poll(&p, 1, 100) <= 0)
			continue;
		unsigned char buf[1500];
		ssize_t n = recv(dns_fd, buf, sizeof(buf), 0);
		if (n <= 12)
			continue;
		atomic_fetch_add(&dns_queries, 1);
		if (query_has(buf, (size_t)n, "hang") || query_has(buf, (size_t)n, "hang1"))
			atomic_fetch_add(&dns_hang_queries, 1);
		if (query_has(buf, (size_t)n, "up") || query_has(buf, (size_t)n, "up2"))
			atomic_fetch_add(&dns_up_queries, 1);
		/* never answered */
	}
	return NULL;
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

static int bind_over(const char *src, const char *target)
{
	if (mount(src, target, NULL, MS_BIND, NULL) != 0) {
		fprintf(stderr, "resolve_hang: bind %s over %s: %s\n", src, target, strerror(errno));
		return -1;
	}
	return 0;
}

/* The private namespace, the files and the silent nameserver; -1 on failure. */
static int setup(char *ns_addr, size_t ns_len)
{
	if (unshare(CLONE_NEWNS) != 0) {
		fprintf(stderr, "resolve_hang: unshare(CLONE_NEWNS): %s\n", strerror(errno));
		return -1;
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
		fprintf(stderr, "resolve_hang: make / private: %s\n", strerror(errno));
		return -1;
	}
	/* a loopback address of our own (port 53 of 127.0.0.1 may be taken) */
	dns_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (dns_fd < 0)
		return -1;
	struct sockaddr_in a;
	bool bound = false;
	for (int i = 0; i < 50 && !bound; i++) {
		memset(&a, 0, sizeof(a));
		a.sin_family = AF_INET;
		a.sin_port = htons(53);
		a.sin_addr.s_addr = htonl(0x7f350000u | (uint32_t)((getpid() * 7 + i * 131) & 0xfffe) | 1u);
		bound = bind(dns_fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	}
	if (!bound) {
		fprintf(stderr, "resolve_hang: bind a UDP socket to 127.53.x.y:53: %s\n", strerror(errno));
		return -1;
	}
	inet_ntop(AF_INET, &a.sin_addr, ns_addr, (socklen_t)ns_len);

	char dir[] = "/tmp/dlock-resolve-XXXXXX";
	if (!mkdtemp(dir)) {
		fprintf(stderr, "resolve_hang: mkdtemp: %s\n", strerror(errno));
		return -1;
	}
	char resolv[128], nss[128], hosts[128], text[256];
	snprintf(resolv, sizeof(resolv), "%s/resolv.conf", dir);
	snprintf(nss, sizeof(nss), "%s/nsswitch.conf", dir);
	snprintf(hosts, sizeof(hosts), "%s/hosts", dir);
	/* one try of 30 s: longer than anything measured here */
	snprintf(text, sizeof(text), "nameserver %s\noptions timeout:30 attempts:1\n", ns_addr);
	if (write_file(resolv, text) || write_file(nss, "hosts: files dns\n") ||
	    write_file(hosts, "127.0.0.1 localhost\n127.0.0.1 " UP_NAME "\n127.0.0.1 up2.dlock-test.example\n")) {
		fprintf(stderr, "resolve_hang: write files in %s: %s\n", dir, strerror(errno));
		return -1;
	}
	int rc = bind_over(resolv, "/etc/resolv.conf") || bind_over(nss, "/etc/nsswitch.conf") ||
				 bind_over(hosts, "/etc/hosts")
			 ? -1
			 : 0;
	/* the mounts hold the files: the directory can go */
	unlink(resolv);
	unlink(nss);
	unlink(hosts);
	rmdir(dir);
	return rc;
}

/* Open uri (expected to hang in DNS); checks the code, message and bound. */
static void hang_case(const char *uri)
{
	dlock_store *s = NULL;
	long long t0 = tu_now_ms();
	int rc = dlock_store_open_timeout(&s, uri, OPEN_TIMEOUT_MS);
	long long took = tu_now_ms() - t0;
	if (rc == DLOCK_ENOTSUPPORTED && strstr(dlock_error_last()->message, "built without")) {
		printf("  %-70s not compiled in\n", uri);
		return;
	}
	long long slack = OPEN_TIMEOUT_MS / 20 > 50 ? OPEN_TIMEOUT_MS / 20 : 50;
	printf("  %-70s %5lld ms  %s: %s\n", uri, took, dlock_error_name(rc), dlock_error_last()->message);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out resolving ") != NULL);
	CHECK(strstr(dlock_error_last()->message, ".dlock-test.example") != NULL);
	CHECK(took <= OPEN_TIMEOUT_MS + slack + TU_SCHED_GRACE_MS);
	dlock_store_close(s);
}

/* Every 127.0.0.1 of uri replaced by name, into out. */
static void rename_hosts(char *out, size_t size, const char *uri, const char *name)
{
	size_t o = 0;
	for (const char *p = uri; *p && o + strlen(name) + 2 < size;) {
		if (!strncmp(p, "127.0.0.1", 9)) {
			o += (size_t)snprintf(out + o, size - o, "%s", name);
			p += 9;
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = '\0';
}

/*
 * Reconnect by name: a Redis store opened through a /etc/hosts name (behind
 * the fault proxy) loses its connection after the name has left /etc/hosts
 * (so the lookup goes to the silent DNS): an acquire that must reconnect
 * returns within its wait + max(50 ms, 5 %).
 */
static void reconnect_case(const char *uri)
{
	char *proxied = NULL, named[1100];
	tu_proxy *px = tu_proxy_start(uri, &proxied);
	CHECK(px != NULL);
	if (!px)
		return;
	rename_hosts(named, sizeof(named), proxied, "up2.dlock-test.example");
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_store_open_timeout(&s, named, 10000), 0);
	if (s)
		CHECK_RC(dlock_lock_new(&l, s, "resolve/reconnect", NULL), 0);
	if (l) {
		CHECK_RC(dlock_acquire(l, 5000), 0);
		CHECK_RC(dlock_release(l), 0);
		/* the name leaves /etc/hosts (ours, in this namespace), its cached
		 * answer (5 s) runs out, the connection is reset */
		FILE *f = fopen("/etc/hosts", "r");
		char buf[512] = "";
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = '\0';
		CHECK(strstr(buf, "up2.dlock-test.example") != NULL); /* it is our file */
		if (strstr(buf, "up2.dlock-test.example"))
			CHECK(write_file("/etc/hosts", "127.0.0.1 localhost\n127.0.0.1 " UP_NAME "\n") == 0);
		struct timespec nap = { 5, 300000000 };
		nanosleep(&nap, NULL);
		CHECK(tu_proxy_set(px, -1, "reset") == 0);
		CHECK(tu_proxy_set(px, -1, "pass") == 0);
		int before = atomic_load(&dns_up_queries);
		long long t0 = tu_now_ms();
		int rc = dlock_acquire(l, 2000);
		long long took = tu_now_ms() - t0;
		printf("  redis      reconnect by a name the DNS never answers: %s in %lld ms (wait 2000): %s\n",
		       dlock_error_name(rc), took, dlock_error_last()->message);
		CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
		CHECK(took <= 2000 + 100);
		CHECK(atomic_load(&dns_up_queries) > before); /* the reconnect asked the DNS */
		if (rc == 0)
			dlock_release(l);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	tu_proxy_stop(px);
	free(proxied);
}

/* A running server's URI with 127.0.0.1 replaced by a /etc/hosts name: opens at once, no DNS query. */
static void hosts_case(const char *store, const char *file)
{
	char uri[1024] = "", named[1100];
	FILE *f = fopen(file, "r");
	if (!f || !fgets(uri, sizeof(uri), f)) {
		fprintf(stderr, "resolve_hang: cannot read the %s URI from %s\n", store, file);
		tu_failures++;
		if (f)
			fclose(f);
		return;
	}
	fclose(f);
	uri[strcspn(uri, "\r\n")] = '\0';
	char *ip = strstr(uri, "127.0.0.1");
	if (!ip) {
		fprintf(stderr, "resolve_hang: %s: no 127.0.0.1 in %s\n", store, uri);
		tu_failures++;
		return;
	}
	/* every occurrence (Redlock and ensembles name several) */
	rename_hosts(named, sizeof(named), uri, UP_NAME);
	if (strstr(store, "_tls")) {
		/* TLS checks the name, not the address it was pinned to: the
		 * server's certificate names 127.0.0.1 and localhost, not UP_NAME */
		dlock_store *s = NULL;
		int rc = dlock_store_open_timeout(&s, named, 10000);
		printf("  %-10s TLS via a name the certificate lacks: %s: %s\n", store, dlock_error_name(rc),
		       dlock_error_last()->message);
		CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_EAUTH);
		dlock_store_close(s);
		rename_hosts(named, sizeof(named), uri, "localhost");
	}
	int before = atomic_load(&dns_up_queries);
	dlock_store *s = NULL;
	long long t0 = tu_now_ms();
	int rc = dlock_store_open_timeout(&s, named, 10000);
	long long took = tu_now_ms() - t0;
	printf("  %-10s via /etc/hosts name: %s in %lld ms\n", store, dlock_error_name(rc), took);
	CHECK_RC(rc, 0);
	CHECK(atomic_load(&dns_up_queries) == before);
	if (s) {
		dlock_lock *l = NULL;
		CHECK_RC(dlock_lock_new(&l, s, "resolve/hosts-name", NULL), 0);
		if (l) {
			CHECK_RC(dlock_acquire(l, 5000), 0);
			CHECK_RC(dlock_release(l), 0);
		}
		dlock_lock_free(l);
	}
	dlock_store_close(s);
	if (!strcmp(store, "redis"))
		reconnect_case(uri);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (geteuid() != 0 && !getenv("CI")) {
		printf("SKIP: resolve_hang needs root for a private mount namespace (CI runs it as root)\n");
		return 77;
	}
	char ns[INET_ADDRSTRLEN];
	if (setup(ns, sizeof(ns)) != 0) {
		fprintf(stderr, "resolve_hang: FAILED to set up the hung DNS (this is a failure, not a skip)\n");
		return 1;
	}
	pthread_t dns;
	if (pthread_create(&dns, NULL, dns_main, NULL) != 0)
		return 1;
	printf("silent nameserver on %s:53; open timeout %d ms\n", ns, OPEN_TIMEOUT_MS);

	static const char *const uris[] = {
		"redis://" HANG_NAME ":6379",
		"redis+sentinel://" HANG_NAME ":26379/mymaster",
		"redlock://hang1.dlock-test.example:6379,hang2.dlock-test.example:6379,"
		"hang3.dlock-test.example:6379",
		"etcd://" HANG_NAME ":2379",
		"etcd://hang1.dlock-test.example:2379,hang2.dlock-test.example:2379",
		"etcds://" HANG_NAME ":2379",
		"zk://" HANG_NAME ":2181",
		"zk://hang1.dlock-test.example:2181,hang2.dlock-test.example:2181",
		"postgres://u:p@" HANG_NAME ":5432/db",
		"postgres://u:p@" HANG_NAME ":5432/db?mode=advisory",
		"mysql://u:p@" HANG_NAME ":3306/db",
		"mysql://u:p@" HANG_NAME ":3306/db?mode=get_lock",
		"memcached://" HANG_NAME ":11211",
	};
	for (size_t i = 0; i < sizeof(uris) / sizeof(uris[0]); i++)
		hang_case(uris[i]);
	/* the hang was the DNS's: our nameserver was asked */
	CHECK(atomic_load(&dns_hang_queries) > 0);

	for (int i = 1; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		if (!eq) {
			fprintf(stderr, "usage: resolve_hang [STORE=URIFILE ...]\n");
			return 64;
		}
		*eq = '\0';
		hosts_case(argv[i], eq + 1);
	}
	atomic_store(&dns_stop, true);
	pthread_join(dns, NULL);
	close(dns_fd);
	printf("DNS queries seen: %d\n", atomic_load(&dns_queries));
	return tu_done("resolve.hang");
}
