#include "testutil/faultproxy.h"
#include "faultproxy_uri.h" /* src/cli: dlock check rewrites URIs the same way */
#include "testutil/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DLOCK_FAULTPROXY
#define DLOCK_FAULTPROXY "faultproxy"
#endif

#define REPLY_TIMEOUT_MS 10000
#define MAX_ROUTES 16

struct tu_proxy {
	pid_t pid;
	int ctl;
	int nroutes;
	pthread_mutex_t mu;
	char dir[64];
	char sock[96];
};

/* Read one line from fd into buf (without the newline) within timeout_ms. */
static int read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
	size_t n = 0;
	long long deadline = tu_now_ms() + timeout_ms;
	while (n + 1 < cap) {
		long long left = deadline - tu_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
			fprintf(stderr, "faultproxy: no reply within %d ms\n", timeout_ms);
			return -1;
		}
		ssize_t r = read(fd, buf + n, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "faultproxy: connection closed\n");
			return -1;
		}
		if (buf[n] == '\n') {
			buf[n] = '\0';
			return 0;
		}
		n++;
	}
	fprintf(stderr, "faultproxy: reply too long\n");
	return -1;
}

static int command(tu_proxy *p, const char *cmd, char *reply, size_t cap)
{
	int error = -1;
	size_t len = strlen(cmd);
	pthread_mutex_lock(&p->mu);
	if (send(p->ctl, cmd, len, MSG_NOSIGNAL) != (ssize_t)len || send(p->ctl, "\n", 1, MSG_NOSIGNAL) != 1) {
		fprintf(stderr, "faultproxy: send '%s': %s\n", cmd, strerror(errno));
		goto out;
	}
	if (read_line(p->ctl, reply, cap, REPLY_TIMEOUT_MS) < 0)
		goto out;
	if (strncmp(reply, "ok", 2) != 0) {
		fprintf(stderr, "faultproxy: '%s': %s\n", cmd, reply);
		goto out;
	}
	error = 0;
out:
	pthread_mutex_unlock(&p->mu);
	return error;
}

tu_proxy *tu_proxy_start(const char *uri, char **proxied)
{
	char targets[MAX_ROUTES][FAULTPROXY_HOST_MAX], err[400];
	int ports[MAX_ROUTES];
	const char *hs, *he;
	int out_pipe[2] = { -1, -1 };
	tu_proxy *p = NULL;
	char *copy = NULL;
	*proxied = NULL;

	int n = faultproxy_uri_hosts(uri, targets, MAX_ROUTES, &hs, &he, err, sizeof(err));
	if (n < 0) {
		fprintf(stderr, "faultproxy: %s: %s\n", uri, err);
		return NULL;
	}
	if (!(p = calloc(1, sizeof(*p))))
		return NULL;
	p->pid = -1;
	p->ctl = -1;
	p->nroutes = n;
	pthread_mutex_init(&p->mu, NULL);
	snprintf(p->dir, sizeof(p->dir), "/tmp/dlock-fp-XXXXXX");
	if (!mkdtemp(p->dir)) {
		perror("faultproxy: mkdtemp");
		p->dir[0] = '\0';
		goto fail;
	}
	snprintf(p->sock, sizeof(p->sock), "%s/ctl", p->dir);

	const char *bin = getenv("DLOCK_FAULTPROXY");
	if (!bin || !*bin)
		bin = DLOCK_FAULTPROXY;
	char *argv[MAX_ROUTES + 3];
	argv[0] = (char *)bin;
	argv[1] = p->sock;
	for (int i = 0; i < n; i++)
		argv[i + 2] = targets[i];
	argv[n + 2] = NULL;

	if (pipe2(out_pipe, O_CLOEXEC) < 0) {
		perror("faultproxy: pipe2");
		goto fail;
	}
	pid_t parent = getpid();
	p->pid = fork();
	if (p->pid < 0) {
		perror("faultproxy: fork");
		goto fail;
	}
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out_pipe[1], 1) < 0)
			_exit(127);
		/* Keep stderr for diagnostics; nothing else of the test's. */
		closefrom(3);
		execv(bin, argv);
		fprintf(stderr, "faultproxy: exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(out_pipe[1]);
	out_pipe[1] = -1;

	char line[64];
	for (int i = 0; i < n; i++) {
		char *end;
		if (read_line(out_pipe[0], line, sizeof(line), REPLY_TIMEOUT_MS) < 0)
			goto fail;
		long v = strtol(line, &end, 10);
		if (*end || v <= 0 || v > 65535) {
			fprintf(stderr, "faultproxy: unexpected output '%s'\n", line);
			goto fail;
		}
		ports[i] = (int)v;
	}
	if (read_line(out_pipe[0], line, sizeof(line), REPLY_TIMEOUT_MS) < 0 || strcmp(line, "ready") != 0) {
		fprintf(stderr, "faultproxy: did not get ready\n");
		goto fail;
	}
	close(out_pipe[0]);
	out_pipe[0] = -1;

	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", p->sock);
	if ((p->ctl = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    connect(p->ctl, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		fprintf(stderr, "faultproxy: connect %s: %s\n", p->sock, strerror(errno));
		goto fail;
	}

	if (!(copy = faultproxy_uri_rewrite(uri, hs, he, ports, n)))
		goto fail;
	*proxied = copy;
	return p;

fail:
	if (out_pipe[0] >= 0)
		close(out_pipe[0]);
	if (out_pipe[1] >= 0)
		close(out_pipe[1]);
	if (p->pid > 0) {
		kill(p->pid, SIGKILL);
		waitpid(p->pid, NULL, 0);
	}
	p->pid = -1;
	tu_proxy_stop(p);
	return NULL;
}

int tu_proxy_set(tu_proxy *p, int route, const char *mode)
{
	char cmd[128], reply[256];
	if (route >= 0)
		snprintf(cmd, sizeof(cmd), "%s %d", mode, route);
	else
		snprintf(cmd, sizeof(cmd), "%s", mode);
	return command(p, cmd, reply, sizeof(reply));
}

int tu_proxy_dropmatch(tu_proxy *p, int route, const void *pattern, size_t len)
{
	char cmd[16 + 4 * 128 + 16], reply[256];
	const unsigned char *b = pattern;
	if (len == 0 || len > 128) {
		fprintf(stderr, "faultproxy: a dropmatch pattern has 1..128 bytes\n");
		return -1;
	}
	size_t n = (size_t)snprintf(cmd, sizeof(cmd), "dropmatch ");
	for (size_t i = 0; i < len; i++) {
		if (b[i] > ' ' && b[i] < 0x7f && b[i] != '\\')
			cmd[n++] = (char)b[i];
		else
			n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, "\\x%02x", b[i]);
	}
	cmd[n] = '\0';
	if (route >= 0)
		snprintf(cmd + n, sizeof(cmd) - n, " %d", route);
	return command(p, cmd, reply, sizeof(reply));
}

int tu_proxy_fired(tu_proxy *p, int route, long long *fired)
{
	char cmd[32], reply[256];
	snprintf(cmd, sizeof(cmd), "stats %d", route);
	if (command(p, cmd, reply, sizeof(reply)) < 0)
		return -1;
	const char *f = strstr(reply, " fired=");
	if (!f || sscanf(f, " fired=%lld", fired) != 1) {
		fprintf(stderr, "faultproxy: bad stats reply '%s'\n", reply);
		return -1;
	}
	return 0;
}

int tu_proxy_stats(tu_proxy *p, int route, long long *conns, long long *open, long long *up, long long *down,
		   long long *dropped)
{
	char cmd[32], reply[256];
	long long v[5];
	snprintf(cmd, sizeof(cmd), "stats %d", route);
	if (command(p, cmd, reply, sizeof(reply)) < 0)
		return -1;
	if (sscanf(reply, "ok conns=%lld open=%lld up=%lld down=%lld dropped=%lld", &v[0], &v[1], &v[2], &v[3],
		   &v[4]) != 5) {
		fprintf(stderr, "faultproxy: bad stats reply '%s'\n", reply);
		return -1;
	}
	long long *outs[5] = { conns, open, up, down, dropped };
	for (int i = 0; i < 5; i++)
		if (outs[i])
			*outs[i] = v[i];
	return 0;
}

int tu_proxy_routes(const tu_proxy *p)
{
	return p->nroutes;
}

void tu_proxy_stop(tu_proxy *p)
{
	if (!p)
		return;
	if (p->ctl >= 0) {
		char reply[64];
		command(p, "quit", reply, sizeof(reply));
		close(p->ctl);
	}
	if (p->pid > 0) {
		int status = 0;
		pid_t r = 0;
		for (int i = 0; i < 500 && (r = waitpid(p->pid, &status, WNOHANG)) == 0; i++)
			usleep(10000);
		if (r == 0) {
			fprintf(stderr, "faultproxy: pid %d did not quit; killing it\n", (int)p->pid);
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &status, 0);
			tu_failures++;
		} else if (r == p->pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
			fprintf(stderr, "faultproxy: exited with status 0x%x\n", status);
			tu_failures++;
		}
	}
	if (p->sock[0])
		unlink(p->sock);
	if (p->dir[0])
		rmdir(p->dir);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
