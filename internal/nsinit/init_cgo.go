//go:build linux && cgo

package nsinit

// With cgo, init's work is done by the C constructor below, which the
// dynamic loader runs before the Go runtime starts: init never starts Go
// (its runtime and ~80 package inits cost ~30 ms of CPU per tool start,
// most of what the namespace added), and the trampoline is init's fork,
// which goes on to the next constructor, the trampoline's own
// (sandbox/trampoline, priority 201 to this one's 200), without a second
// exec. It is
// the pattern runc's nsenter uses: before the runtime, the process has
// one thread, so fork is safe. nsinit_linux.go's init is the same work in
// Go for builds without cgo; a cgo build never reaches it (the constructor
// takes Env out of the environment the trampoline's Go reads).
//
// It does what nsinit_linux.go's reap does, in the same order, with the
// same failures (StartFailure, FailPrefix), but for signals: init keeps
// the default dispositions, with which the kernel delivers a namespace's
// init nothing but SIGKILL and SIGSTOP from an ancestor namespace (as
// Go's signal.Ignore there), and the trampoline, hence the tool, inherits
// capgate's dispositions instead of an ignored SIGHUP and SIGINT.

/*
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#endif
#ifndef PR_CAP_AMBIENT_LOWER
#define PR_CAP_AMBIENT_LOWER 3
#endif
#ifndef CAP_SYS_ADMIN
#define CAP_SYS_ADMIN 21
#endif

// Kept in step with doc.go: Env, StartFailure, FailPrefix.
static const char capgate_nsinit_env[] = "CAPGATE_SANDBOX_INIT=";
#define CAPGATE_NSINIT_FAILURE 126

static void capgate_nsinit_write(const char *s, size_t n) {
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

// capgate_nsinit_fail ends init as the launcher reports a refused start:
// stderr "capgate sandbox: <msg><detail>", status 126.
static void capgate_nsinit_fail(const char *msg, const char *detail) {
	char buf[512];
	size_t n = 0;
	const char *parts[3] = {"capgate sandbox: ", msg, detail};
	for (int i = 0; i < 3; i++) {
		for (const char *p = parts[i]; p && *p && n < sizeof buf - 1; p++)
			buf[n++] = *p;
	}
	buf[n++] = '\n';
	capgate_nsinit_write(buf, n);
	_exit(CAPGATE_NSINIT_FAILURE);
}

// capgate_nsinit_quote is v in double quotes, anything but printable
// ASCII escaped, cut to fit out.
static const char *capgate_nsinit_quote(const char *v, char *out, size_t size) {
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;
	out[n++] = '"';
	for (; *v && n + 6 < size; v++) {
		unsigned char c = (unsigned char)*v;
		if (c == '"' || c == '\\') {
			out[n++] = '\\';
			out[n++] = (char)c;
		} else if (c >= 0x20 && c < 0x7f) {
			out[n++] = (char)c;
		} else {
			out[n++] = '\\';
			out[n++] = 'x';
			out[n++] = hex[c >> 4];
			out[n++] = hex[c & 15];
		}
	}
	out[n++] = '"';
	out[n] = 0;
	return out;
}

// capgate_nsinit_parse reads "ALIVE,NOTIFY" (nsinit.Value): ALIVE a
// descriptor or -1, NOTIFY 0 or 1. It returns 0 when v is malformed.
static int capgate_nsinit_parse(const char *v, int *alive, int *notify) {
	const char *p = v;
	if (p[0] == '-' && p[1] == '1' && p[2] == ',') {
		*alive = -1;
		p += 2;
	} else {
		long a = 0;
		if (*p < '0' || *p > '9')
			return 0;
		for (; *p >= '0' && *p <= '9'; p++) {
			a = a * 10 + (*p - '0');
			if (a > 1 << 20)
				return 0;
		}
		*alive = (int)a;
	}
	if (p[0] != ',' || (p[1] != '0' && p[1] != '1') || p[2] != 0)
		return 0;
	*notify = p[1] == '1';
	return 1;
}

// capgate_nsinit_readable polls fd once without waiting: a pidfd is
// readable once its process has exited.
static int capgate_nsinit_readable(int fd) {
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	return poll(&pfd, 1, 0) > 0;
}

__attribute__((constructor(200))) static void capgate_nsinit(int argc, char **argv, char **envp) {
	(void)argc;
	(void)argv;
	char **slot = NULL;
	for (char **e = envp; e != NULL && *e != NULL; e++) {
		if (strncmp(*e, capgate_nsinit_env, sizeof capgate_nsinit_env - 1) == 0) {
			slot = e;
			break;
		}
	}
	if (slot == NULL)
		return; // not a tool's init: capgate starts as usual
	const char *v = *slot + sizeof capgate_nsinit_env - 1;
	int alive, notify;
	if (!capgate_nsinit_parse(v, &alive, &notify)) {
		char q[128];
		capgate_nsinit_fail("the tool's init: malformed CAPGATE_SANDBOX_INIT ", capgate_nsinit_quote(v, q, sizeof q));
	}
	// Out of the environment the trampoline's Go runtime reads (this very
	// array): the trampoline is not init.
	for (char **e = slot; *e != NULL; e++)
		e[0] = e[1];

	if (getpid() != 1)
		capgate_nsinit_fail("the tool's init is not PID 1 of a namespace", "");
	// Go set the parent-death signal before exec; capgate may have died
	// before that (its pidfd says so), and then nothing would signal.
	if (alive >= 0 && capgate_nsinit_readable(alive))
		capgate_nsinit_fail("capgate exited before the tool started", "");
	// Its /proc, as nsinit_linux.go's mountProc: private first, so that the
	// new /proc does not propagate to the host's mounts; where the kernel
	// refuses, the host's stays. Then the ambient CAP_SYS_ADMIN an
	// unprivileged capgate's launcher handed init for it is lowered, before
	// the fork, so the trampoline never holds it.
	if (mount("", "/", "", MS_REC | MS_PRIVATE, "") == 0)
		(void)mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
	(void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, CAP_SYS_ADMIN, 0, 0);
	// init reaps: children it waits for must not be reaped for it.
	signal(SIGCHLD, SIG_DFL);

	pid_t child = fork();
	if (child < 0)
		capgate_nsinit_fail("starting the trampoline: ", strerror(errno));
	if (child == 0) {
		// The trampoline, on init's stdio and descriptors 3-5, as
		// os.StartProcess hands them: it goes on to the trampoline's
		// constructor.
		if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != 1)
			_exit(CAPGATE_NSINIT_FAILURE); // init is gone: so is the namespace
		if (alive < 0)
			close(3);
		else if (alive != 3 && dup2(alive, 3) < 0)
			_exit(CAPGATE_NSINIT_FAILURE);
		if (!notify)
			close(4);
		return;
	}
	// init keeps none of the tool's pipes open: capgate sees their end when
	// the tool's processes close them, not when init exits.
	for (int fd = 0; fd <= 5; fd++)
		close(fd);
	for (;;) {
		int ws;
		pid_t pid = waitpid(-1, &ws, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			capgate_nsinit_fail("waiting for the tool: ", strerror(errno));
		}
		if (pid != child)
			continue; // an orphan of the namespace, reaped
		if (WIFEXITED(ws))
			_exit(WEXITSTATUS(ws));
		if (WIFSIGNALED(ws))
			_exit(128 + WTERMSIG(ws)); // a PID 1 cannot die of its own signal
	}
}
*/
import "C"
