/*
 * dlock_sys_nopipe (src/stores/support.h): writes to a socket whose peer has
 * gone, wrapped by it, fail with EPIPE instead of killing the program with
 * SIGPIPE (which is left at its default here, as in a program that never
 * thought of it); a SIGPIPE that was pending before the wrapped write stays
 * pending (it is not ours to take); the signal mask comes back as it was.
 * Without the wrapper the same second write kills the process (checked in a
 * child: it dies of SIGPIPE).
 */
#include "testutil/testutil.h"
#include "stores/support.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Two writes to a socket whose peer closed: the second raises SIGPIPE. */
static int write_twice(int fd)
{
	ssize_t a = write(fd, "x", 1);
	ssize_t b = write(fd, "x", 1);
	return a < 0 && b < 0 ? errno : 0;
}

static int dead_pair(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		exit(2);
	close(sv[1]);
	return sv[0];
}

int main(void)
{
	signal(SIGPIPE, SIG_DFL);
	/* unwrapped: the program dies (the failure the wrapper prevents) */
	pid_t pid = fork();
	if (pid == 0) {
		write_twice(dead_pair());
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE);

	/* wrapped: EPIPE, nothing pending afterwards, the mask as it was */
	sigset_t before, after, pending;
	pthread_sigmask(SIG_SETMASK, NULL, &before);
	int fd = dead_pair();
	dlock_sys_nopipe np;
	dlock_sys_nopipe_begin(&np);
	int e = write_twice(fd);
	dlock_sys_nopipe_end(&np);
	CHECK(e == EPIPE);
	sigpending(&pending);
	CHECK(!sigismember(&pending, SIGPIPE));
	pthread_sigmask(SIG_SETMASK, NULL, &after);
	CHECK(sigismember(&after, SIGPIPE) == sigismember(&before, SIGPIPE));
	close(fd);

	/* a SIGPIPE pending before (blocked by the program) stays pending */
	sigset_t pipe;
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, NULL);
	raise(SIGPIPE);
	fd = dead_pair();
	dlock_sys_nopipe_begin(&np);
	write_twice(fd);
	dlock_sys_nopipe_end(&np);
	sigpending(&pending);
	CHECK(sigismember(&pending, SIGPIPE));
	pthread_sigmask(SIG_SETMASK, NULL, &after);
	CHECK(sigismember(&after, SIGPIPE)); /* still blocked, as the program left it */
	struct timespec zero = { 0, 0 };
	CHECK(sigtimedwait(&pipe, NULL, &zero) == SIGPIPE);
	close(fd);
	return tu_done("unit.nopipe");
}
