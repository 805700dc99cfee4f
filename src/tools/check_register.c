/* check_register.c — the register the workers of `dlock check` write through:
 * a file with one record, under flock, that refuses stale fences when asked (check.h). */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>

/*
 * One access to the register. write=false: read (value into *value);
 * write=true: store *value. Returns 1 accepted, 0 refused (stale fence),
 * -1 on an I/O error. *highest_before gets the highest fence seen before.
 */
int check_reg_access(const char *path, bool fencing, bool write_op, uint64_t fence, int64_t *value,
		     uint64_t *highest_before)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int ok = -1;
	while (flock(fd, LOCK_EX) != 0)
		if (errno != EINTR)
			goto out;
	reg_state r;
	if (pread(fd, &r, sizeof r, 0) != (ssize_t)sizeof r)
		goto out;
	*highest_before = r.highest;
	bool stale = fence < r.highest;
	if (fencing && stale) {
		if (write_op)
			r.rejected++;
		ok = 0;
	} else {
		if (fence > r.highest)
			r.highest = fence;
		if (write_op) {
			r.value = *value;
			r.accepted++;
			if (stale)
				r.stale_accepted++;
		} else {
			*value = r.value;
		}
		ok = 1;
	}
	if (pwrite(fd, &r, sizeof r, 0) != (ssize_t)sizeof r)
		ok = -1;
out:
	close(fd); /* drops the flock */
	return ok;
}
