/* The sandbox launcher: joins cgroups, sets rlimits, drops to the sandbox uid, then execs the
   command it reads from a pipe (or its own argv). Compiled once by launch.py, which documents
   the command line, the message format and the status channel; shipped as package data. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int report_fd = -1;           /* -s: where die() also reports its reason (one line) */
static const char *report_tag = "";  /* "F " on the status channel, "" to the waiting parent */

static void die(const char *what, const char *arg) {
    char msg[512];
    int n = snprintf(msg, sizeof msg, "looprl-launch: %s %s: %s\n", what, arg ? arg : "",
                     strerror(errno));
    if (n < 0 || n >= (int)sizeof msg) n = (int)sizeof msg - 1;
    msg[n - 1] = '\n';
    for (int i = 0; i < n - 1; i++) if (msg[i] == '\n') msg[i] = ' ';
    if (write(2, msg, n) < 0) { /* nothing left to tell it to */ }
    if (report_fd >= 0 && (write(report_fd, report_tag, strlen(report_tag)) < 0
                           || write(report_fd, msg, n) < 0)) { /* no reason then */ }
    _exit(125);
}

int main(int argc, char **argv) {
    int wait_fd = -1, ext = 0, status_fd = -1;
    char **now = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {            /* exec the rest right away (no -w) */
            now = argv + i + 1;
            break;
        }
        if (!strcmp(a, "-x")) { ext = 1; continue; }
        if (!v) { errno = EINVAL; die("missing value after", a); }
        if (!strcmp(a, "-c")) {            /* join a cgroup: before anything can fork */
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
            int fd = open(v, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, pid, n) != n) die("cannot join cgroup", v);
            close(fd);
        } else if (!strcmp(a, "-r")) {     /* RES:SOFT:HARD */
            int res; unsigned long long soft, hard;
            if (sscanf(v, "%d:%llu:%llu", &res, &soft, &hard) != 3) {
                errno = EINVAL; die("bad rlimit", v);
            }
            struct rlimit rl = {(rlim_t)soft, (rlim_t)hard};
            if (setrlimit(res, &rl) != 0) die("setrlimit", v);
        } else if (!strcmp(a, "-u")) {     /* last: the unprivileged host uid */
            unsigned id = (unsigned)strtoul(v, NULL, 10);
            if (setgroups(0, NULL) != 0) die("setgroups", v);
            if (setresgid(id, id, id) != 0) die("setresgid", v);
            if (setresuid(id, id, id) != 0) die("setresuid", v);
        } else if (!strcmp(a, "-w")) {
            wait_fd = atoi(v);
        } else if (!strcmp(a, "-s")) {     /* -x: report the exit status here, don't exec */
            status_fd = atoi(v);
        } else {
            errno = EINVAL; die("unknown option", a);
        }
        i++;
    }
    if (now) {
        if (!now[0]) { errno = EINVAL; die("nothing to run after", "--"); }
        execv(now[0], now);
        die("exec", now[0]);
    }
    if (wait_fd < 0) { errno = EINVAL; die("missing", "-w FD"); }
    if (ext && status_fd >= 0) {
        /* -s: fork now, before the command comes: the child waits for it and execs it, this
           process reports on status_fd: "R" first (the sandbox is up: written before the
           child exists, so a command that kills this process cannot have it unsaid), then
           "F why" if the child or this process failed, else the command's status ("%d\n",
           128+signal when killed) as soon as it ends, so the host need not wait for the
           namespaces to be torn down */
        prctl(PR_SET_DUMPABLE, 0);         /* the command cannot reach status_fd via /proc */
        if (write(status_fd, "R\n", 2) != 2) die("write", "status");
        report_fd = status_fd;
        report_tag = "F ";
        int err[2];                        /* the child's failures; closed by its exec */
        if (pipe2(err, O_CLOEXEC) != 0) die("pipe", NULL);
        pid_t child = fork();
        if (child < 0) die("fork", NULL);
        if (child > 0) {
            close(wait_fd);
            close(err[1]);
            char why[512];
            ssize_t got = 0, r;
            while (got < (ssize_t)sizeof why - 1
                   && ((r = read(err[0], why + got, sizeof why - 1 - got)) > 0
                       || (r < 0 && errno == EINTR)))
                if (r > 0) got += r;
            int st = 0;
            while (waitpid(child, &st, 0) < 0) if (errno != EINTR) die("waitpid", NULL);
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            char line[600];
            int n;
            if (got > 0) {                 /* one line: the reason without its newlines */
                why[got] = '\0';
                for (char *c = why; *c; c++) if (*c == '\n') *c = ' ';
                n = snprintf(line, sizeof line, "F %s\n", why);
                code = 125;
            } else {
                n = snprintf(line, sizeof line, "%d\n", code);
            }
            if (write(status_fd, line, n) != n) die("write", "status");
            return code;
        }
        close(status_fd);                  /* (execve makes the child dumpable again) */
        close(err[0]);
        report_fd = err[1];
        report_tag = "";
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {                             /* the message: NUL-terminated strings, then EOF */
        if (len == cap && !(buf = realloc(buf, cap *= 2))) die("out of memory", NULL);
        ssize_t n = read(wait_fd, buf + len, cap - len);
        if (n == 0) break;
        if (n < 0) { if (errno == EINTR) continue; die("read", "command line"); }
        len += (size_t)n;
    }
    close(wait_fd);
    if (len == 0) return 0;                /* never used: exit quietly */
    if (buf[len - 1] != '\0') { errno = EINVAL; die("truncated", "command line"); }
    size_t n_str = 0;
    for (size_t i = 0; i < len; i++) n_str += buf[i] == '\0';
    char **strs = calloc(n_str + 2, sizeof *strs);
    if (!strs) die("out of memory", NULL);
    for (size_t i = 0, k = 0; i < len; k++) { strs[k] = buf + i; i += strlen(buf + i) + 1; }
    if (!ext) {                            /* argv only */
        execv(strs[0], strs);
        die("exec", strs[0]);
    }
    /* -x: CWD, then KEY=VALUE entries up to an empty string, then argv */
    char **env = strs + 1, **args = env;
    while (*args && **args) args++;
    if (!*args) { errno = EINVAL; die("no end of environment in", "message"); }
    *args++ = NULL;
    if (!*args) { errno = EINVAL; die("no command in", "message"); }
    if (chdir(strs[0]) != 0) die("chdir", strs[0]);
    if (!strchr(args[0], '/')) {           /* a bare name: look it up on the command's PATH */
        const char *path = "";
        for (char **e = env; *e; e++)
            if (!strncmp(*e, "PATH=", 5)) path = *e + 5;
        size_t nl = strlen(args[0]);
        char full[4096];
        for (const char *p = path; *p; ) {
            const char *c = strchrnul(p, ':');
            size_t dl = (size_t)(c - p);
            if (dl && dl + nl + 2 <= sizeof full) {
                memcpy(full, p, dl);
                full[dl] = '/';
                memcpy(full + dl + 1, args[0], nl + 1);
                execve(full, args, env);   /* back only if it cannot run: try the next */
            }
            p = *c ? c + 1 : c;
        }
        /* found nowhere, or not runnable: the shell runs the line (plain words, so joining
           them gives it back) and reports it as it always would ("not found", 127) */
        size_t len = 1;
        for (char **a = args; *a; a++) len += strlen(*a) + 1;
        char *line = malloc(len), *q = line;
        if (!line) die("out of memory", NULL);
        for (char **a = args; *a; a++) {
            size_t n = strlen(*a);
            memcpy(q, *a, n);
            q += n;
            *q++ = a[1] ? ' ' : '\0';
        }
        char *sh[] = {"/bin/sh", "-c", line, NULL};
        execve(sh[0], sh, env);
        die("exec", sh[0]);
    }
    execve(args[0], args, env);
    die("exec", args[0]);
}
