/*
 * etcd_bench — uncontended acquire+release latency of dlock's etcd store
 * next to the floor of the same work done by hand in the same run: one
 * lease grant, then per round a Txn (create the key with the lease if
 * absent, read the oldest key) and a DeleteRange, over one reused curl
 * connection.
 *
 *   etcd_bench etcd://127.0.0.1:2379 [ROUNDS]
 *
 * Prints mean / median / p99 in microseconds for both. Not a test.
 */
#define _GNU_SOURCE
#include <dlock/dlock.h>

#include <curl/curl.h>
#include <json-c/json.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n)
{
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += v[i];
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	printf("%-34s rounds %5d  mean %8.0f us  median %8.0f us  p99 %8.0f us\n", what, n, sum / n, v[n / 2],
	       v[(int)(n * 0.99)]);
}

static char *b64(const char *s)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = strlen(s);
	char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned char)s[i] << 16;
		if (i + 1 < n)
			v |= (unsigned char)s[i + 1] << 8;
		if (i + 2 < n)
			v |= (unsigned char)s[i + 2];
		*p++ = t[v >> 18 & 63];
		*p++ = t[v >> 12 & 63];
		*p++ = i + 1 < n ? t[v >> 6 & 63] : '=';
		*p++ = i + 2 < n ? t[v & 63] : '=';
	}
	*p = 0;
	return o;
}

typedef struct buf {
	char data[65536];
	size_t n;
} buf;

static size_t sink(char *d, size_t s, size_t m, void *ud)
{
	buf *b = ud;
	size_t len = s * m;
	if (b->n + len >= sizeof(b->data))
		return 0;
	memcpy(b->data + b->n, d, len);
	b->n += len;
	b->data[b->n] = 0;
	return len;
}

static json_object *post(CURL *h, const char *base, const char *path, const char *body)
{
	static buf b;
	char url[512];
	snprintf(url, sizeof(url), "%s%s", base, path);
	b.n = 0;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	if (curl_easy_perform(h) != CURLE_OK) {
		fprintf(stderr, "%s: request failed\n", url);
		exit(1);
	}
	return json_tokener_parse(b.data);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: etcd_bench etcd://host:port [ROUNDS]\n");
		return 64;
	}
	int rounds = argc > 2 ? atoi(argv[2]) : 500;
	if (rounds < 10)
		rounds = 10;
	double *v = calloc((size_t)rounds, sizeof(double));
	char name[64];
	snprintf(name, sizeof(name), "bench-%d", (int)getpid());

	/* dlock and the same round trips by hand, interleaved round by round so
	 * that load on the machine hits both alike. */
	dlock_store *s;
	dlock_lock *l;
	if (dlock_store_open(&s, argv[1]) != 0 || dlock_lock_new(&l, s, name, NULL) != 0) {
		fprintf(stderr, "%s\n", dlock_error_last()->message);
		return 69;
	}
	char base[300];
	const char *hp = strstr(argv[1], "://") ? strstr(argv[1], "://") + 3 : argv[1];
	snprintf(base, sizeof(base), "http://%.*s", (int)strcspn(hp, ",/?"), hp);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	CURL *h = curl_easy_init();
	struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	json_object *g = post(h, base, "/v3/lease/grant", "{\"TTL\":\"60\"}");
	json_object *id;
	if (!json_object_object_get_ex(g, "ID", &id)) {
		fprintf(stderr, "lease grant failed\n");
		return 1;
	}
	char key[128], dir[128], end[128];
	snprintf(dir, sizeof(dir), "raw/%s/", name);
	snprintf(end, sizeof(end), "raw/%s0", name);
	snprintf(key, sizeof(key), "raw/%s/owner", name);
	char *k = b64(key), *d = b64(dir), *e = b64(end);
	char txn[2048], del[512];
	snprintf(
		txn, sizeof(txn),
		"{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\",\"result\":\"EQUAL\"}],"
		"\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"eA==\",\"lease\":\"%s\"}},"
		"{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}],"
		"\"failure\":[]}",
		k, k, json_object_get_string(id), d, e);
	snprintf(del, sizeof(del), "{\"key\":\"%s\"}", k);
	double *raw = calloc((size_t)rounds, sizeof(double));
	double *parts[4];
	for (int p = 0; p < 4; p++)
		parts[p] = calloc((size_t)rounds, sizeof(double));
	for (int i = 0; i < rounds + 20; i++) {
		double t = now_us();
		if (dlock_acquire(l, 0) != 0) {
			fprintf(stderr, "dlock: %s\n", dlock_error_last()->message);
			return 1;
		}
		double ta = now_us();
		if (dlock_release(l) != 0) {
			fprintf(stderr, "dlock: %s\n", dlock_error_last()->message);
			return 1;
		}
		double t1 = now_us();
		json_object_put(post(h, base, "/v3/kv/txn", txn));
		double tt = now_us();
		json_object_put(post(h, base, "/v3/kv/deleterange", del));
		double t2 = now_us();
		if (i >= 20) { /* warm-up: lease grant, connections */
			v[i - 20] = t1 - t;
			raw[i - 20] = t2 - t1;
			parts[0][i - 20] = ta - t;
			parts[1][i - 20] = t1 - ta;
			parts[2][i - 20] = tt - t1;
			parts[3][i - 20] = t2 - tt;
		}
	}
	report("dlock acquire(try)+release", v, rounds);
	report("raw Txn+DeleteRange (same conn)", raw, rounds);
	report("  dlock acquire", parts[0], rounds);
	report("  dlock release", parts[1], rounds);
	report("  raw Txn", parts[2], rounds);
	report("  raw DeleteRange", parts[3], rounds);
	for (int p = 0; p < 4; p++)
		free(parts[p]);
	free(raw);
	dlock_lock_free(l);
	dlock_store_close(s);
	json_object_put(g);
	curl_slist_free_all(hd);
	curl_easy_cleanup(h);
	free(k);
	free(d);
	free(e);
	free(v);
	return 0;
}
