//go:build linux && cgo

package trampoline

// With cgo, the trampoline's work is done by the C constructor below,
// which the dynamic loader runs before the Go runtime starts: a confined
// start never starts Go in the trampoline (its runtime and package inits
// were about two thirds of the trampoline's CPU), as internal/nsinit's
// init does not. trampoline_linux.go's apply is the same work in Go for
// builds without cgo; a cgo build never reaches it. The two do the same
// steps in the same order with the same failures (nsinit.StartFailure,
// nsinit.FailPrefix); TestTrampolineWithoutCgo runs the sandbox's
// confinement tests through a build without cgo.
//
// Before the runtime the process has one thread, so each call below binds
// the whole process: the thread that execs the tool is the only one.
//
// nsinit's constructor runs first (priority 200 there, 201 here): in a
// tool's PID namespace it forks, and this runs in its child.

/*
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>

// Kept in step with trampoline_linux.go and sys_linux.go (Env, PlanFD,
// NotifyFD, planVersion, the kernel's numbers) and nsinit's doc.go
// (StartFailure, FailPrefix, Env).
static const char capgate_tr_env[] = "CAPGATE_SANDBOX_SPEC=";
static const char capgate_tr_init_env[] = "CAPGATE_SANDBOX_INIT=";
#define CAPGATE_TR_PLAN_FD 5
#define CAPGATE_TR_NOTIFY_FD 4
#define CAPGATE_TR_PLAN_VERSION 1
#define CAPGATE_TR_FAILURE 126

#define CAPGATE_SYS_CLOSE_RANGE 436
#define CAPGATE_SYS_LANDLOCK_CREATE_RULESET 444
#define CAPGATE_SYS_LANDLOCK_ADD_RULE 445
#define CAPGATE_SYS_LANDLOCK_RESTRICT_SELF 446
#define CAPGATE_CLOSE_RANGE_CLOEXEC (1U << 2)
#define CAPGATE_SECCOMP_SET_MODE_FILTER 1
#define CAPGATE_SECCOMP_NEW_LISTENER (1UL << 3)
#define CAPGATE_SECCOMP_WAIT_KILLABLE_RECV (1UL << 5)
#define CAPGATE_LANDLOCK_RULE_PATH_BENEATH 1
#define CAPGATE_PR_CAP_AMBIENT 47
#define CAPGATE_PR_CAP_AMBIENT_CLEAR_ALL 4
#define CAPGATE_CAP_SETPCAP 8
#define CAPGATE_CAP_V3 0x20080522

// Landlock's access sets, as accessRead, accessWrite, accessFile.
#define LL_READ (1ULL << 0 | 1ULL << 2 | 1ULL << 3)
#define LL_WRITE (1ULL << 1 | 1ULL << 4 | 1ULL << 5 | 1ULL << 6 | 1ULL << 7 | 1ULL << 8 | 1ULL << 9 | \
	1ULL << 10 | 1ULL << 11 | 1ULL << 12 | 1ULL << 14)
#define LL_FILE (1ULL << 0 | 1ULL << 1 | 1ULL << 14 | 1ULL << 2)

static void capgate_tr_write(const char *s, size_t n) {
	while (n > 0) {
		ssize_t w = write(2, s, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

// capgate_tr_fail ends the trampoline as fail does: stderr
// "capgate sandbox: <message>", status 126. With err not 0, the message
// ends in the errno's text in Go's wording (strerror's, first letter
// lowered).
static void capgate_tr_fail(int err, const char *format, ...) {
	char buf[4096];
	size_t n = (size_t)snprintf(buf, sizeof buf - 2, "capgate sandbox: ");
	va_list ap;
	va_start(ap, format);
	int k = vsnprintf(buf + n, sizeof buf - 2 - n, format, ap);
	va_end(ap);
	n = k < 0 ? n : n + (size_t)k < sizeof buf - 2 ? n + (size_t)k : sizeof buf - 3;
	if (err) {
		size_t start = n;
		k = snprintf(buf + n, sizeof buf - 2 - n, "%s", strerror(err));
		n = k < 0 ? n : n + (size_t)k < sizeof buf - 2 ? n + (size_t)k : sizeof buf - 3;
		if (n > start && buf[start] >= 'A' && buf[start] <= 'Z')
			buf[start] = (char)(buf[start] - 'A' + 'a');
	}
	buf[n++] = '\n';
	capgate_tr_write(buf, n);
	_exit(CAPGATE_TR_FAILURE);
}

// The plan, as plan_linux.go encodes it.
struct capgate_tr_strs {
	size_t n;
	char **v; // NULL-terminated
};

struct capgate_tr_plan {
	char *path, *dir, *audit_tag;
	struct capgate_tr_strs argv, env, read_dirs, read_files, write_dirs, write_files;
	int landlock, no_tcp, no_socket, no_fork, no_unix, notify, set_user;
	uint64_t handled_fs, handled_net, scoped;
	uint32_t restrict_flags;
	size_t nfilter;
	struct sock_filter *filter;
	int64_t uid, gid, alive;
};

struct capgate_tr_dec {
	const unsigned char *b;
	size_t n;
	const char *err;
};

static uint64_t capgate_tr_uv(struct capgate_tr_dec *d) {
	uint64_t v = 0;
	if (d->err)
		return 0;
	for (int shift = 0; shift < 70; shift += 7) {
		if (d->n == 0)
			break;
		unsigned char c = *d->b++;
		d->n--;
		if (shift == 63 && c > 1)
			break;
		v |= (uint64_t)(c & 0x7f) << shift;
		if (c < 0x80)
			return v;
	}
	d->err = "a number cut short or too long";
	return 0;
}

static size_t capgate_tr_count(struct capgate_tr_dec *d) {
	uint64_t n = capgate_tr_uv(d);
	if (!d->err && n > d->n) {
		d->err = "a length past its end";
		return 0;
	}
	return (size_t)n;
}

// A string may hold no NUL: Go's syscalls refuse one (EINVAL), and C's
// would cut the string there.
static char *capgate_tr_str(struct capgate_tr_dec *d) {
	size_t n = capgate_tr_count(d);
	if (d->err)
		return NULL;
	if (memchr(d->b, 0, n) != NULL) {
		d->err = "a string with a NUL in it";
		return NULL;
	}
	char *s = malloc(n + 1);
	if (s == NULL) {
		d->err = "out of memory";
		return NULL;
	}
	memcpy(s, d->b, n);
	s[n] = 0;
	d->b += n;
	d->n -= n;
	return s;
}

static void capgate_tr_strs(struct capgate_tr_dec *d, struct capgate_tr_strs *out) {
	size_t n = capgate_tr_count(d);
	out->n = 0;
	out->v = calloc(n + 1, sizeof(char *));
	if (out->v == NULL) {
		d->err = "out of memory";
		return;
	}
	for (size_t i = 0; i < n && !d->err; i++) {
		out->v[i] = capgate_tr_str(d);
		out->n = i + 1;
	}
}

static int capgate_tr_flag(struct capgate_tr_dec *d) {
	uint64_t v = capgate_tr_uv(d);
	if (v > 1 && !d->err)
		d->err = "a flag neither 0 nor 1";
	return v == 1;
}

// capgate_tr_num reads a varint, the Go side's int (64 bits wide where
// capgate builds).
static int64_t capgate_tr_num(struct capgate_tr_dec *d) {
	uint64_t u = capgate_tr_uv(d);
	int64_t v = (int64_t)(u >> 1);
	if (u & 1)
		v = ~v;
	return v;
}

static void capgate_tr_decode(struct capgate_tr_dec *d, struct capgate_tr_plan *p) {
	p->path = capgate_tr_str(d);
	capgate_tr_strs(d, &p->argv);
	capgate_tr_strs(d, &p->env);
	p->dir = capgate_tr_str(d);
	p->landlock = capgate_tr_flag(d);
	p->handled_fs = capgate_tr_uv(d);
	p->handled_net = capgate_tr_uv(d);
	p->scoped = capgate_tr_uv(d);
	uint64_t rf = capgate_tr_uv(d);
	if (rf > UINT32_MAX && !d->err)
		d->err = "restrict flags past 32 bits";
	p->restrict_flags = (uint32_t)rf;
	capgate_tr_strs(d, &p->read_dirs);
	capgate_tr_strs(d, &p->read_files);
	capgate_tr_strs(d, &p->write_dirs);
	capgate_tr_strs(d, &p->write_files);
	p->no_tcp = capgate_tr_flag(d);
	p->no_socket = capgate_tr_flag(d);
	p->no_fork = capgate_tr_flag(d);
	p->no_unix = capgate_tr_flag(d);
	p->notify = capgate_tr_flag(d);
	size_t nf = capgate_tr_count(d);
	if (!d->err && nf > 0xffff)
		d->err = "a filter too long";
	p->nfilter = nf;
	p->filter = calloc(nf + 1, sizeof(struct sock_filter));
	if (p->filter == NULL && !d->err)
		d->err = "out of memory";
	for (size_t i = 0; i < nf && !d->err; i++) {
		uint64_t in = capgate_tr_uv(d);
		p->filter[i].code = (uint16_t)in;
		p->filter[i].jt = (uint8_t)(in >> 16);
		p->filter[i].jf = (uint8_t)(in >> 24);
		p->filter[i].k = (uint32_t)(in >> 32);
	}
	p->set_user = capgate_tr_flag(d);
	p->uid = capgate_tr_num(d);
	p->gid = capgate_tr_num(d);
	p->alive = capgate_tr_num(d);
	if (!d->err && (p->alive < -1 || p->alive > INT_MAX))
		d->err = "a descriptor out of range";
	if (!d->err && p->set_user && (p->uid < 0 || p->uid > UINT32_MAX - 1 || p->gid < 0 || p->gid > UINT32_MAX - 1))
		d->err = "an id out of range";
	p->audit_tag = capgate_tr_str(d);
	if (!d->err && d->n > 0)
		d->err = "bytes past its end";
}

static int capgate_tr_has_cap(int c) {
	struct { uint32_t version; int pid; } hdr = {CAPGATE_CAP_V3, 0};
	struct { uint32_t effective, permitted, inheritable; } data[2];
	memset(data, 0, sizeof data);
	if (syscall(SYS_capget, &hdr, data) != 0)
		return 0;
	return (data[c / 32].effective & (1U << (c % 32))) != 0;
}

static void capgate_tr_drop_bounding(void) {
	for (int c = 0; c < 64; c++) {
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) == 0)
			continue;
		if (errno == EINVAL)
			return; // past this kernel's last capability
		if (errno == EPERM && !capgate_tr_has_cap(CAPGATE_CAP_SETPCAP))
			return;
		capgate_tr_fail(errno, "capabilities: dropping capability %d from the bounding set: ", c);
	}
}

static void capgate_tr_add_paths(int ruleset, const struct capgate_tr_strs *paths, uint64_t access) {
	if (access == 0)
		return; // a rule granting nothing is an error to the kernel
	for (size_t i = 0; i < paths->n; i++) {
		int fd = open(paths->v[i], O_PATH | O_CLOEXEC);
		if (fd < 0 && errno == ENOENT)
			continue; // gone since the launcher listed it: it grants nothing
		if (fd < 0)
			capgate_tr_fail(errno, "landlock: opening \"%s\" for its rule: ", paths->v[i]);
		struct __attribute__((packed)) { uint64_t access; int32_t fd; } attr = {access, fd};
		if (syscall(CAPGATE_SYS_LANDLOCK_ADD_RULE, ruleset, CAPGATE_LANDLOCK_RULE_PATH_BENEATH, &attr, 0) != 0)
			capgate_tr_fail(errno, "landlock: landlock_add_rule for \"%s\" with access %#llx: ", paths->v[i], (unsigned long long)access);
		close(fd);
	}
}

static void capgate_tr_landlock(const struct capgate_tr_plan *p) {
	if (p->audit_tag[0] != 0 && prctl(PR_SET_NAME, p->audit_tag, 0, 0, 0) != 0)
		capgate_tr_fail(errno, "audit tag: ");
	if (p->handled_fs == 0 && p->handled_net == 0 && p->scoped == 0)
		capgate_tr_fail(0, "landlock: the plan's ruleset handles nothing");
	struct { uint64_t fs, net, scoped; } attr = {p->handled_fs, p->handled_net, p->scoped};
	long ruleset = syscall(CAPGATE_SYS_LANDLOCK_CREATE_RULESET, &attr, sizeof attr, 0);
	if (ruleset < 0)
		capgate_tr_fail(errno, "landlock: landlock_create_ruleset: ");
	capgate_tr_add_paths((int)ruleset, &p->read_dirs, LL_READ & p->handled_fs);
	capgate_tr_add_paths((int)ruleset, &p->read_files, LL_READ & LL_FILE & p->handled_fs);
	capgate_tr_add_paths((int)ruleset, &p->write_dirs, (LL_READ | LL_WRITE) & p->handled_fs);
	capgate_tr_add_paths((int)ruleset, &p->write_files, (LL_READ | LL_WRITE) & LL_FILE & p->handled_fs);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		capgate_tr_fail(errno, "landlock: no_new_privs: ");
	if (syscall(CAPGATE_SYS_LANDLOCK_RESTRICT_SELF, (int)ruleset, p->restrict_flags) != 0)
		capgate_tr_fail(errno, "landlock: landlock_restrict_self: ");
	close((int)ruleset);
}

// capgate_tr_as is as(): " as run_as UID:GID" when the tool is not
// capgate's own user.
static const char *capgate_tr_as(const struct capgate_tr_plan *p, char *buf, size_t size) {
	if (!p->set_user)
		return "";
	snprintf(buf, size, " as run_as %lld:%lld", (long long)p->uid, (long long)p->gid);
	return buf;
}

static void capgate_tr_close_stray(void) {
	if (syscall(CAPGATE_SYS_CLOSE_RANGE, 3U, ~0U, CAPGATE_CLOSE_RANGE_CLOEXEC) == 0)
		return;
	int cerr = errno;
	// Before Linux 5.11, one by one from /proc; without it, no tool starts.
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		capgate_tr_fail(errno, "descriptors: close_range: %s; listing /proc/self/fd: ", strerror(cerr));
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end != 0 || end == e->d_name || fd <= 2)
			continue;
		if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) != 0 && errno != EBADF)
			capgate_tr_fail(errno, "descriptors: close_range: %s; descriptor %s: ", strerror(cerr), e->d_name);
	}
	closedir(d);
}

static void capgate_tr_seccomp(const struct capgate_tr_plan *p) {
	struct sock_fprog prog = {.len = (unsigned short)p->nfilter, .filter = p->filter};
	if (!p->notify) {
		if (syscall(SYS_seccomp, CAPGATE_SECCOMP_SET_MODE_FILTER, 0UL, &prog) != 0)
			capgate_tr_fail(errno, "seccomp: loading the filter: ");
		return;
	}
	// WAIT_KILLABLE_RECV: once capgate has received a notification, no
	// signal but a fatal one ends the tool's wait, which would restart the
	// syscall while capgate records it (see sendListener). A kernel before
	// 5.19 refuses the flag (EINVAL): the filter loads without it there.
	long listener = syscall(SYS_seccomp, CAPGATE_SECCOMP_SET_MODE_FILTER,
		CAPGATE_SECCOMP_NEW_LISTENER | CAPGATE_SECCOMP_WAIT_KILLABLE_RECV, &prog);
	if (listener < 0 && errno == EINVAL)
		listener = syscall(SYS_seccomp, CAPGATE_SECCOMP_SET_MODE_FILTER, CAPGATE_SECCOMP_NEW_LISTENER, &prog);
	if (listener < 0)
		capgate_tr_fail(errno, "seccomp: loading the notifying filter: ");
	char byte = 0;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	memset(&u, 0, sizeof u);
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	int lfd = (int)listener;
	memcpy(CMSG_DATA(c), &lfd, sizeof lfd);
	ssize_t sent;
	do
		sent = sendmsg(CAPGATE_TR_NOTIFY_FD, &msg, 0);
	while (sent < 0 && errno == EINTR);
	int serr = errno;
	close(lfd);
	close(CAPGATE_TR_NOTIFY_FD);
	if (sent < 0)
		capgate_tr_fail(serr, "seccomp: handing the listener to capgate: ");
}

// capgate_tr_under is under: p is d or inside it.
static int capgate_tr_under(const char *p, const char *d) {
	size_t n = strlen(d);
	return strcmp(p, d) == 0 || strcmp(d, "/") == 0 || (strncmp(p, d, n) == 0 && p[n] == '/');
}

// capgate_tr_exec_path is execPath: the program relative to the working
// directory wd when it is below it. The plan's path is clean already
// (the launcher's filepath.Clean'd program), which execPath also checks:
// a path that is not is run as it is.
static char *capgate_tr_exec_path(const char *path, const char *wd) {
	size_t n = strlen(path);
	int unclean = strstr(path, "//") || strstr(path, "/./") || strstr(path, "/../") ||
		(n > 1 && path[n - 1] == '/') || (n >= 2 && strcmp(path + n - 2, "/.") == 0) ||
		(n >= 3 && strcmp(path + n - 3, "/..") == 0);
	if (wd[0] == 0 || path[0] != '/' || unclean || !capgate_tr_under(path, wd))
		return (char *)path;
	const char *rel = path + strlen(wd);
	if (*rel == '/')
		rel++;
	if (*rel == 0)
		rel = ".";
	char *out = malloc(strlen(rel) + 3);
	if (out == NULL)
		return (char *)path;
	strcpy(out, "./");
	strcat(out, rel);
	return out;
}

__attribute__((constructor(201))) static void capgate_trampoline(int argc, char **argv, char **envp) {
	(void)argc;
	(void)argv;
	const char *v = NULL;
	for (char **e = envp; e != NULL && *e != NULL; e++) {
		if (strncmp(*e, capgate_tr_init_env, sizeof capgate_tr_init_env - 1) == 0)
			return; // the tool's init comes first (nsinit): not this process
		if (strncmp(*e, capgate_tr_env, sizeof capgate_tr_env - 1) == 0)
			v = *e + sizeof capgate_tr_env - 1;
	}
	if (v == NULL)
		return; // not a trampoline: capgate starts as usual
	if (strcmp(v, "5") != 0) {
		capgate_tr_fail(0, "reading the plan: CAPGATE_SANDBOX_SPEC=\"%.200s\" names no plan descriptor", v);
	}
	// Read and closed before anything else: the tool never inherits it.
	size_t cap = 1 << 16, n = 0;
	unsigned char *buf = malloc(cap);
	for (;;) {
		if (buf == NULL)
			capgate_tr_fail(0, "reading the plan: out of memory");
		ssize_t r = read(CAPGATE_TR_PLAN_FD, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			capgate_tr_fail(errno, "reading the plan: ");
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == cap)
			buf = realloc(buf, cap *= 2);
	}
	close(CAPGATE_TR_PLAN_FD);
	if (n == 0 || buf[0] != CAPGATE_TR_PLAN_VERSION)
		capgate_tr_fail(0, "reading the plan: not a plan of this capgate's (was its binary replaced while it ran?)");
	struct capgate_tr_dec d = {.b = buf + 1, .n = n - 1};
	struct capgate_tr_plan p;
	memset(&p, 0, sizeof p);
	capgate_tr_decode(&d, &p);
	if (d.err)
		capgate_tr_fail(0, "reading the plan: a malformed plan: %s", d.err);

	// apply, step by step.
	capgate_tr_drop_bounding();
	if (p.landlock)
		capgate_tr_landlock(&p);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		capgate_tr_fail(errno, "no_new_privs: ");
	char as[64];
	if (p.dir[0] != 0 && chdir(p.dir) != 0)
		capgate_tr_fail(errno, "working directory%s: chdir %s: ", capgate_tr_as(&p, as, sizeof as), p.dir);
	char wd[PATH_MAX];
	if (getcwd(wd, sizeof wd) == NULL)
		wd[0] = 0;
	if (p.set_user) {
		if (setgroups(0, NULL) != 0)
			capgate_tr_fail(errno, "run_as %lld:%lld: setgroups: ", (long long)p.uid, (long long)p.gid);
		if (setresgid((gid_t)p.gid, (gid_t)p.gid, (gid_t)p.gid) != 0)
			capgate_tr_fail(errno, "run_as %lld:%lld: setgid: ", (long long)p.uid, (long long)p.gid);
		if (setresuid((uid_t)p.uid, (uid_t)p.uid, (uid_t)p.uid) != 0)
			capgate_tr_fail(errno, "run_as %lld:%lld: setuid: ", (long long)p.uid, (long long)p.gid);
	}
	if (prctl(CAPGATE_PR_CAP_AMBIENT, CAPGATE_PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
		capgate_tr_fail(errno, "capabilities: clearing the ambient set: ");
	{
		struct { uint32_t version; int pid; } hdr = {CAPGATE_CAP_V3, 0};
		struct { uint32_t effective, permitted, inheritable; } data[2];
		memset(data, 0, sizeof data);
		if (syscall(SYS_capset, &hdr, data) != 0)
			capgate_tr_fail(errno, "capabilities: capset: ");
	}
	// tieToCapgate: the parent-death signal again (a user switch clears
	// it), then capgate's pidfd, readable once capgate has exited.
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
		capgate_tr_fail(errno, "parent-death signal: ");
	if (p.alive >= 0) {
		struct pollfd pfd = {.fd = (int)p.alive, .events = POLLIN};
		int ready = poll(&pfd, 1, 0);
		close((int)p.alive);
		if (ready > 0)
			capgate_tr_fail(0, "capgate exited before the tool started");
	}
	capgate_tr_close_stray();
	if ((p.no_socket || p.no_unix || p.no_fork) && p.nfilter == 0)
		capgate_tr_fail(0, "seccomp: the plan refuses syscalls but holds no filter");
	if (p.nfilter > 0)
		capgate_tr_seccomp(&p);
	execve(capgate_tr_exec_path(p.path, wd), p.argv.v, p.env.v);
	capgate_tr_fail(errno, "exec %s%s: ", p.path, capgate_tr_as(&p, as, sizeof as));
}
*/
import "C"
