#include "testutil/testutil.h"

#include "core/internal.h"

#include <string.h>

static dlock_uri *parse_ok(const char *text)
{
	dlock_uri *u = NULL;
	CHECK_RC(dlock_sys_uri_parse(&u, text), 0);
	return u;
}

static void parse_bad(const char *text, const char *needle)
{
	dlock_uri *u = NULL;
	int rc = dlock_sys_uri_parse(&u, text);
	if (rc == 0) {
		const char *v = dlock_uri_param(u, "x"); /* consume nothing else */
		(void)v;
		rc = dlock_sys_uri_check_unused(u);
		dlock_sys_uri_free(u);
	}
	if (rc != DLOCK_EINVAL || !strstr(dlock_error_last()->message, needle)) {
		fprintf(stderr, "uri '%s': rc %s message '%s', wanted EINVAL mentioning '%s'\n", text,
			dlock_error_name(rc), dlock_error_last()->message, needle);
		tu_failures++;
	}
}

int main(void)
{
	dlock_uri *u = parse_ok("redis://alice:s%40cret@127.0.0.1:6379/2?ttl=5s&prefix=app");
	CHECK(strcmp(u->scheme, "redis") == 0);
	CHECK(strcmp(u->user, "alice") == 0 && strcmp(u->password, "s@cret") == 0);
	CHECK(strcmp(u->hosts, "127.0.0.1:6379") == 0 && strcmp(u->path, "/2") == 0);
	CHECK(u->ttl_ms == 5000 && strcmp(u->prefix, "app") == 0);
	CHECK(dlock_sys_uri_check_unused(u) == 0);
	dlock_sys_uri_free(u);

	u = parse_ok("sqlite:relative.db");
	CHECK(u->hosts == NULL && strcmp(u->path, "relative.db") == 0 && u->ttl_ms == 30000);
	CHECK(strcmp(u->prefix, "dlock") == 0 && u->connect_timeout_ms == 5000);
	dlock_sys_uri_free(u);

	u = parse_ok("SQLITE:///tmp/x%20y.db");
	CHECK(strcmp(u->scheme, "sqlite") == 0 && strcmp(u->hosts, "") == 0);
	CHECK(strcmp(u->path, "/tmp/x y.db") == 0);
	dlock_sys_uri_free(u);

	u = parse_ok("etcd://h1:2379,h2:2380,[::1]:2381,h4?connect_timeout=250ms&extra=1");
	dlock_hostport *hp;
	size_t n;
	CHECK_RC(dlock_uri_hosts(u, 2379, &hp, &n), 0);
	CHECK(n == 4);
	if (n == 4) {
		CHECK(strcmp(hp[0].host, "h1") == 0 && hp[0].port == 2379);
		CHECK(strcmp(hp[1].host, "h2") == 0 && hp[1].port == 2380);
		CHECK(strcmp(hp[2].host, "::1") == 0 && hp[2].port == 2381);
		CHECK(strcmp(hp[3].host, "h4") == 0 && hp[3].port == 2379);
	}
	dlock_free(hp);
	CHECK(u->connect_timeout_ms == 250);
	CHECK_RC(dlock_sys_uri_check_unused(u), DLOCK_EINVAL); /* extra=1 nobody read */
	CHECK(strstr(dlock_error_last()->message, "extra") != NULL);
	CHECK(strcmp(dlock_uri_param(u, "extra"), "1") == 0);
	CHECK_RC(dlock_sys_uri_check_unused(u), 0);
	dlock_sys_uri_free(u);

	static const char *bad_hosts[] = { "redis://:6379", "redis://h:0",  "redis://h:70000", "redis://h:12x",
					   "redis://[::1",  "redis://a,,b", "redis://h:" };
	for (size_t i = 0; i < sizeof(bad_hosts) / sizeof(bad_hosts[0]); i++) {
		u = parse_ok(bad_hosts[i]);
		if (u) {
			CHECK_RC(dlock_uri_hosts(u, 6379, &hp, &n), DLOCK_EINVAL);
			CHECK(strstr(dlock_error_last()->message, "host") != NULL);
			dlock_sys_uri_free(u);
		}
	}

	parse_bad("", "empty");
	parse_bad("127.0.0.1:6379", "scheme");
	parse_bad("redis//x", "scheme");
	parse_bad("redis://h?ttl=-1s", "ttl");
	parse_bad("redis://h?ttl=abc", "ttl");
	parse_bad("redis://h?ttl=1ms", "ttl");
	parse_bad("redis://h?connect_timeout=0", "connect_timeout");
	parse_bad("redis://h?a=1&a=2", "twice");
	parse_bad("redis://h?=1", "without a name");
	parse_bad("redis://h/%zz", "percent");
	parse_bad("redis://u:p%00w@h", "percent");
	parse_bad("redis://h#frag", "fragment");
	parse_bad("redis://h?bogus=1", "bogus");
	parse_bad("redis://h?prefix=", "prefix");

	/* The user info is split off first: a password may hold '/', '?', '#',
	 * '@' (issue 30: "redis://:Sek/r1tXY@host" was read as the path "/r1tXY@host"). */
	static const struct {
		const char *text, *user, *password, *hosts, *path, *prefix;
	} ui[] = {
		{ "redis://:Sek/r1tXY@127.0.0.1:6379", "", "Sek/r1tXY", "127.0.0.1:6379", "", "dlock" },
		{ "redis://u:p?a#b@h:1/2?prefix=x", "u", "p?a#b", "h:1", "/2", "x" },
		{ "redis://:a@b/c@h", "", "a@b/c", "h", "", "dlock" },
		{ "redis://u:12/ab@h/3", "u", "12/ab", "h", "/3", "dlock" },
		{ "redis://u:12?ab@h", "u", "12?ab", "h", "", "dlock" },
		{ "redis://:Sek%2Fr1%3F%40x@h", "", "Sek/r1?@x", "h", "", "dlock" },
		{ "redis://:pass@host/0?prefix=a@b", "", "pass", "host", "/0", "a@b" },
		{ "redis://host:1/0?prefix=team@example", NULL, NULL, "host:1", "/0", "team@example" },
		{ "redlock://:S/e?k#@h1:1,h2:2,[::1]:3?prefix=p", "", "S/e?k#", "h1:1,h2:2,[::1]:3", "", "p" },
		{ "redis+cluster://u:b64/+x==@h:1,h:2", "u", "b64/+x==", "h:1,h:2", "", "dlock" },
		{ "sqlite:///tmp/a@b/x.db", NULL, NULL, "", "/tmp/a@b/x.db", "dlock" },
	};
	for (size_t i = 0; i < sizeof(ui) / sizeof(ui[0]); i++) {
		u = parse_ok(ui[i].text);
		if (!u)
			continue;
		int same = (ui[i].user ? u->user && !strcmp(u->user, ui[i].user) : !u->user) &&
			   (ui[i].password ? u->password && !strcmp(u->password, ui[i].password) : !u->password) &&
			   !strcmp(u->hosts, ui[i].hosts) && !strcmp(u->path, ui[i].path) &&
			   !strcmp(u->prefix, ui[i].prefix);
		if (!same) {
			fprintf(stderr, "uri '%s': user '%s' hosts '%s' path '%s' prefix '%s'\n", ui[i].text,
				u->user ? u->user : "(none)", u->hosts, u->path, u->prefix);
			tu_failures++;
		}
		dlock_sys_uri_free(u);
		char *red = dlock__uri_redact(ui[i].text);
		if (ui[i].password && strlen(ui[i].password) >= 3) {
			CHECK(red && !strstr(red, ui[i].password + strlen(ui[i].password) - 3));
			CHECK(red && strstr(red, ":***@"));
		}
		free(red);
	}

	/* Redaction never shows the password. */
	char *r = dlock__uri_redact("postgres://bob:hunter2@db:5432/x?sslmode=require&password=topsecret");
	CHECK(r && !strstr(r, "hunter2") && !strstr(r, "topsecret"));
	CHECK(r && strstr(r, "bob:***@db:5432") && strstr(r, "password=***"));
	free(r);
	r = dlock__uri_redact("redis://h:1");
	CHECK(r && strcmp(r, "redis://h:1") == 0);
	free(r);

	/* Store-level errors: unknown scheme, compiled-out store message. */
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, "nosuch://x"), DLOCK_EINVAL);
	CHECK(s == NULL && strstr(dlock_error_last()->message, "unknown store scheme 'nosuch:'"));
	CHECK_RC(dlock_store_open(&s, "not a uri"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "sqlite://somehost/x.db"), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "host") != NULL);
	return tu_done("unit.uri");
}
