/*
 * fake_mps_control.c: a stand-in for NVIDIA's nvidia-cuda-mps-control (the MPS control daemon and
 * its client) on machines without a GPU, built by test/fake-nvml/build.ts as
 * .cache/fake-nvml/mps/nvidia-cuda-mps-control. It has the real program's command line and
 * environment, its `control` socket in the pipe directory, its control.log lines and its messages
 * when no daemon runs or one already does; it starts no MPS server, since there is no
 * CUDA client to serve.
 *
 *   nvidia-cuda-mps-control -d   forks the control daemon and returns 0 once it listens (1, with
 *                                the reason on stderr, when it cannot start)
 *   nvidia-cuda-mps-control -f   runs the control daemon in the foreground; its log lines also go
 *                                to stdout; SIGTERM or SIGINT end it cleanly (status 0)
 *   nvidia-cuda-mps-control      client: reads ONE command from stdin, sends it to the running
 *                                daemon, prints its answer on stdout (status 0) or its refusal on
 *                                stderr (status 1). No daemon: "Cannot find MPS control daemon
 *                                process" and status 1, as the real one.
 *
 * Environment, as for the real program:
 *   CUDA_MPS_PIPE_DIRECTORY  default /tmp/nvidia-mps: the `control` socket, `control_lock` (held
 *                            by the running daemon), nvidia-cuda-mps-control.pid, and the fake's
 *                            own fake-mps-state.json (below)
 *   CUDA_MPS_LOG_DIRECTORY   default /var/log/nvidia-mps: control.log
 *   CUDA_VISIBLE_DEVICES     read by the daemon: when set, the devices it may use are its entries,
 *                            numbered from 0 (as MPS renumbers them); otherwise 0..63
 * Both directories are created (0755) when missing.
 *
 * Commands (the daemon's answer in brackets):
 *   get_server_list                                  [nothing: no server ever runs]
 *   get_default_active_thread_percentage             [e.g. "100.0"]
 *   set_default_active_thread_percentage <p>         [the value set, "25.0"]; p a number 0..100
 *   set_default_device_pinned_mem_limit <dev> <n>M   [nothing]; also <n>G; dev a device of the
 *                                                    daemon's (see CUDA_VISIBLE_DEVICES), n >= 1
 *   get_default_device_pinned_mem_limit <dev>        [e.g. "4096M"; nothing when none is set]
 *   quit [-t <seconds>]                              [nothing]; the daemon has released the
 *                                                    socket, lock and pid file when the client
 *                                                    returns
 * Anything else is refused (status 1) with a line naming what was wrong and what would be right.
 *
 * control.log: one line per event, as the real daemon writes it,
 *   [2026-11-25 11:02:03.456 Control  4242] Cmd:set_default_active_thread_percentage 25
 * ("Starting control daemon using socket …", "To connect CUDA applications …", then per client
 * "Accepting connection...", "NEW UI", "Cmd:<command>", the answer lines, "UI closed"; "Exit" last).
 *
 * fake-mps-state.json (fake only, for tests; rewritten with tmp + rename before each answer):
 *   {"pid": 4242, "running": true, "foreground": false, "commands": 3,
 *    "cudaVisibleDevices": "GPU-…" | null, "defaultActiveThreadPercentage": 25.0,
 *    "pinnedMemLimitMiB": {"0": 4096}}
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define COMMAND_MAX 1024
#define ANSWER_MAX 4096
#define CLIENT_TIMEOUT_MS 5000

static const char *g_pipe_dir;
static const char *g_log_dir;
static char g_socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static int g_foreground;
static int g_listen_fd = -1;
static int g_lock_fd = -1;
static volatile sig_atomic_t g_stop;
static sigset_t g_wait_mask; /* the signal mask inside ppoll: SIGTERM and SIGINT let through */

/* Daemon state. */
static double g_percentage = 100.0;
static long long g_pinned_mib[MAX_DEVICES]; /* 0: none set */
static int g_device_limit = MAX_DEVICES;
static const char *g_visible;
static unsigned long long g_commands;

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);

    return v && v[0] ? v : fallback;
}

static int join_path(char *out, size_t size, const char *dir, const char *name)
{
    int n = snprintf(out, size, "%s/%s", dir, name);

    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* mkdir -p, 0755. */
static int make_dirs(const char *dir)
{
    char path[PATH_MAX];
    size_t i, len = strlen(dir);

    if (len == 0 || len >= sizeof path)
        return -1;
    memcpy(path, dir, len + 1);
    for (i = 1; i <= len; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char saved = path[i];

            path[i] = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return -1;
            path[i] = saved;
        }
    }
    return 0;
}

static __attribute__((format(printf, 1, 2))) void log_line(const char *fmt, ...)
{
    char path[PATH_MAX], stamp[64], text[ANSWER_MAX + 256];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    FILE *f;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    if (join_path(path, sizeof path, g_log_dir, "control.log") == 0 && (f = fopen(path, "a"))) {
        fprintf(f, "[%s.%03ld Control %5ld] %s\n", stamp, ts.tv_nsec / 1000000L, (long)getpid(), text);
        fclose(f);
    }
    if (g_foreground) {
        printf("[%s.%03ld Control %5ld] %s\n", stamp, ts.tv_nsec / 1000000L, (long)getpid(), text);
        fflush(stdout);
    }
}

static void write_state(int running)
{
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    FILE *f;
    int i, first = 1;

    if (join_path(path, sizeof path, g_pipe_dir, "fake-mps-state.json") != 0)
        return;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (!(f = fopen(tmp, "w")))
        return;
    fprintf(f, "{\"pid\": %ld, \"running\": %s, \"foreground\": %s, \"commands\": %llu, \"cudaVisibleDevices\": ",
            (long)getpid(), running ? "true" : "false", g_foreground ? "true" : "false", g_commands);
    if (g_visible) {
        const char *p;

        fputc('"', f);
        for (p = g_visible; *p; p++) {
            if (*p == '"' || *p == '\\')
                fputc('\\', f);
            if ((unsigned char)*p >= 0x20)
                fputc(*p, f);
        }
        fputc('"', f);
    } else {
        fputs("null", f);
    }
    fprintf(f, ", \"defaultActiveThreadPercentage\": %.1f, \"pinnedMemLimitMiB\": {", g_percentage);
    for (i = 0; i < MAX_DEVICES; i++) {
        if (g_pinned_mib[i] > 0) {
            fprintf(f, "%s\"%d\": %lld", first ? "" : ", ", i, g_pinned_mib[i]);
            first = 0;
        }
    }
    fprintf(f, "}}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        unlink(tmp);
}

/* ------------------------------------------------------------------------------------ */
/* Commands                                                                              */
/* ------------------------------------------------------------------------------------ */

struct answer {
    int refused;
    int quit;
    char text[ANSWER_MAX];
};

static __attribute__((format(printf, 2, 3))) void say(struct answer *a, const char *fmt, ...)
{
    size_t used = strlen(a->text);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(a->text + used, sizeof a->text - used, fmt, ap);
    va_end(ap);
}

static __attribute__((format(printf, 2, 3))) void refuse(struct answer *a, const char *fmt, ...)
{
    va_list ap;

    a->refused = 1;
    va_start(ap, fmt);
    vsnprintf(a->text, sizeof a->text, fmt, ap);
    va_end(ap);
}

/* A whole-token decimal integer in [0, max]; -1 otherwise. */
static long long parse_count(const char *s, long long max)
{
    long long v = 0;

    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
        if (v > max)
            return -1;
    }
    return v;
}

static int parse_device(const char *s, struct answer *a)
{
    long long dev = parse_count(s, 1000000);

    if (dev < 0 || dev >= g_device_limit) {
        if (g_visible)
            refuse(a, "Invalid device \"%s\": the daemon's devices are 0 to %d (CUDA_VISIBLE_DEVICES=%s)", s,
                   g_device_limit - 1, g_visible);
        else
            refuse(a, "Invalid device \"%s\": want a device index from 0 to %d", s, g_device_limit - 1);
        return -1;
    }
    return (int)dev;
}

static void run_command(char *line, struct answer *a)
{
    char *tok[4] = { NULL };
    char *save = NULL, *t;
    int n = 0;

    for (t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == 4) {
            refuse(a, "Too many arguments");
            return;
        }
        tok[n++] = t;
    }
    if (n == 0)
        return;

    if (strcmp(tok[0], "get_server_list") == 0) {
        if (n != 1)
            refuse(a, "get_server_list takes no argument");
    } else if (strcmp(tok[0], "get_default_active_thread_percentage") == 0) {
        if (n != 1)
            refuse(a, "get_default_active_thread_percentage takes no argument");
        else
            say(a, "%.1f\n", g_percentage);
    } else if (strcmp(tok[0], "set_default_active_thread_percentage") == 0) {
        char *end = NULL;
        double p;

        if (n != 2) {
            refuse(a, "usage: set_default_active_thread_percentage <percentage from 0 to 100>");
            return;
        }
        errno = 0;
        p = strtod(tok[1], &end);
        if (errno != 0 || end == tok[1] || *end != '\0' || !isfinite(p) || p < 0.0 || p > 100.0) {
            refuse(a, "Invalid percentage \"%s\": want a number from 0 to 100", tok[1]);
            return;
        }
        g_percentage = p;
        say(a, "%.1f\n", g_percentage);
    } else if (strcmp(tok[0], "set_default_device_pinned_mem_limit") == 0) {
        size_t len;
        long long value;
        char unit;
        int dev;

        if (n != 3) {
            refuse(a, "usage: set_default_device_pinned_mem_limit <device> <limit, e.g. 4096M or 4G>");
            return;
        }
        if ((dev = parse_device(tok[1], a)) < 0)
            return;
        len = strlen(tok[2]);
        unit = len > 0 ? tok[2][len - 1] : '\0';
        if (len > 1)
            tok[2][len - 1] = '\0';
        value = len > 1 ? parse_count(tok[2], 1LL << 40) : -1;
        if (len > 1)
            tok[2][len - 1] = unit;
        if (value < 1 || (unit != 'M' && unit != 'm' && unit != 'G' && unit != 'g')) {
            refuse(a, "Invalid limit \"%s\": want a positive whole number of MiB or GiB, e.g. 4096M or 4G", tok[2]);
            return;
        }
        g_pinned_mib[dev] = unit == 'G' || unit == 'g' ? value * 1024 : value;
    } else if (strcmp(tok[0], "get_default_device_pinned_mem_limit") == 0) {
        int dev;

        if (n != 2) {
            refuse(a, "usage: get_default_device_pinned_mem_limit <device>");
            return;
        }
        if ((dev = parse_device(tok[1], a)) < 0)
            return;
        if (g_pinned_mib[dev] > 0)
            say(a, "%lldM\n", g_pinned_mib[dev]);
    } else if (strcmp(tok[0], "quit") == 0) {
        if (!(n == 1 || (n == 3 && strcmp(tok[1], "-t") == 0 && parse_count(tok[2], 1000000) >= 0))) {
            refuse(a, "usage: quit [-t <timeout in seconds>]");
            return;
        }
        a->quit = 1;
    } else if (strcmp(tok[0], "start_server") == 0 || strcmp(tok[0], "get_client_list") == 0 ||
               strcmp(tok[0], "get_server_status") == 0 || strcmp(tok[0], "get_device_client_list") == 0 ||
               strcmp(tok[0], "set_active_thread_percentage") == 0 || strcmp(tok[0], "terminate_client") == 0 ||
               strcmp(tok[0], "shutdown_server") == 0) {
        refuse(a, "%s is a real MPS command that this fake does not model", tok[0]);
    } else {
        refuse(a, "Unknown command \"%s\"", tok[0]);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Daemon                                                                                */
/* ------------------------------------------------------------------------------------ */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void release(void)
{
    char path[PATH_MAX];

    if (g_listen_fd >= 0) {
        close(g_listen_fd);
        g_listen_fd = -1;
        unlink(g_socket_path);
    }
    if (join_path(path, sizeof path, g_pipe_dir, "nvidia-cuda-mps-control.pid") == 0)
        unlink(path);
    write_state(0);
    if (g_lock_fd >= 0) {
        close(g_lock_fd); /* releases the flock */
        g_lock_fd = -1;
    }
}

/* Everything up to listening. On failure writes the reason into why and returns -1; status 1
 * means "already running" (the real program's message). */
static int start_daemon(char *why, size_t size)
{
    char path[PATH_MAX];
    struct sockaddr_un addr;
    FILE *f;
    int visible = 0;

    if (make_dirs(g_pipe_dir) != 0) {
        snprintf(why, size, "cannot create the pipe directory %s: %s", g_pipe_dir, strerror(errno));
        return -1;
    }
    if (make_dirs(g_log_dir) != 0) {
        snprintf(why, size, "cannot create the log directory %s: %s", g_log_dir, strerror(errno));
        return -1;
    }
    if (join_path(path, sizeof path, g_pipe_dir, "control_lock") != 0 ||
        join_path(g_socket_path, sizeof g_socket_path, g_pipe_dir, "control") != 0) {
        snprintf(why, size, "the pipe directory %s is too long for a unix socket path (%zu bytes at most)", g_pipe_dir,
                 sizeof g_socket_path - 1 - strlen("/control"));
        return -1;
    }
    g_lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (g_lock_fd < 0) {
        snprintf(why, size, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(g_lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(why, size, "An instance of this daemon is already running");
        return -1;
    }
    unlink(g_socket_path); /* left by a daemon that was killed */
    g_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, g_socket_path, strlen(g_socket_path) + 1);
    if (g_listen_fd < 0 || bind(g_listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(g_listen_fd, 16) != 0) {
        snprintf(why, size, "cannot listen on %s: %s", g_socket_path, strerror(errno));
        return -1;
    }
    chmod(g_socket_path, 0777); /* clients of any user connect, as to the real one */
    if (join_path(path, sizeof path, g_pipe_dir, "nvidia-cuda-mps-control.pid") == 0 && (f = fopen(path, "w"))) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }
    g_visible = getenv("CUDA_VISIBLE_DEVICES");
    if (g_visible) {
        const char *p = g_visible;

        while (*p) {
            size_t len = strcspn(p, ",");

            if (len > 0)
                visible++;
            p += len;
            if (*p == ',')
                p++;
        }
        g_device_limit = visible < MAX_DEVICES ? visible : MAX_DEVICES;
    }
    write_state(1); /* first: a test that saw the log lines finds the state */
    log_line("Starting control daemon using socket %s", g_socket_path);
    log_line("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=%s", g_pipe_dir);
    return 0;
}

/* Reads one command line (up to a newline or the client's end of input). */
static int read_command(int fd, char *buf, size_t size)
{
    size_t used = 0;

    for (;;) {
        struct pollfd p = { fd, POLLIN, 0 };
        ssize_t got;

        if (poll(&p, 1, CLIENT_TIMEOUT_MS) <= 0)
            return -1;
        got = read(fd, buf + used, size - 1 - used);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -1;
        used += (size_t)got;
        buf[used] = '\0';
        if (got == 0 || memchr(buf, '\n', used))
            break;
        if (used == size - 1)
            return -1;
    }
    buf[strcspn(buf, "\r\n")] = '\0';
    return 0;
}

static void write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t put = write(fd, data, len);

        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            return;
        data += put;
        len -= (size_t)put;
    }
}

static void serve(void)
{
    while (!g_stop) {
        char command[COMMAND_MAX];
        struct pollfd p = { g_listen_fd, POLLIN, 0 };
        struct answer a;
        int fd;

        /* SIGTERM and SIGINT are blocked except inside ppoll, so none is missed between the
         * check of g_stop and the wait. */
        if (ppoll(&p, 1, NULL, &g_wait_mask) <= 0)
            continue;
        fd = accept4(g_listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        log_line("Accepting connection...");
        if (read_command(fd, command, sizeof command) != 0) {
            log_line("User did not send a command");
            close(fd);
            continue;
        }
        log_line("NEW UI");
        log_line("Cmd:%s", command);
        memset(&a, 0, sizeof a);
        run_command(command, &a);
        g_commands++;
        if (a.text[0]) {
            char copy[ANSWER_MAX], *save = NULL, *line;

            memcpy(copy, a.text, sizeof copy);
            for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
                log_line("%s", line);
        }
        if (a.quit) {
            log_line("UI closed");
            log_line("Exit");
            release(); /* before the answer: a client that returned finds the daemon gone */
        } else {
            write_state(1);
            log_line("UI closed");
        }
        write_all(fd, a.refused ? "1" : "0", 1);
        write_all(fd, a.text, strlen(a.text));
        close(fd);
        if (a.quit)
            exit(0);
    }
    log_line("Exit");
    release();
}

static void set_signals(void)
{
    struct sigaction sa;
    sigset_t blocked;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: accept() returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigprocmask(SIG_BLOCK, &blocked, &g_wait_mask);
    sigdelset(&g_wait_mask, SIGTERM);
    sigdelset(&g_wait_mask, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
}

static int run_foreground(void)
{
    char why[PATH_MAX + 512];

    g_foreground = 1;
    set_signals();
    if (start_daemon(why, sizeof why) != 0) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }
    serve();
    return 0;
}

static int run_background(void)
{
    char why[PATH_MAX + 512] = "";
    int report[2];
    pid_t pid;

    if (pipe2(report, O_CLOEXEC) != 0) {
        perror("pipe");
        return 1;
    }
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);

        close(report[0]);
        setsid();
        /* The caller's pipes must not stay open in the daemon (its caller waits for their end). */
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
            if (null > 2)
                close(null);
        }
        if (chdir("/") != 0) {
            /* nothing depends on the working directory */
        }
        set_signals();
        if (start_daemon(why, sizeof why) != 0) {
            write_all(report[1], why, strlen(why));
            _exit(1);
        }
        write_all(report[1], "", 1); /* one NUL byte: listening */
        close(report[1]);
        serve();
        _exit(0);
    }
    close(report[1]);
    {
        char buf[PATH_MAX + 512];
        size_t used = 0;
        ssize_t got;

        while (used < sizeof buf - 1 && (got = read(report[0], buf + used, sizeof buf - 1 - used)) != 0) {
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                break;
            used += (size_t)got;
            if (buf[0] == '\0')
                break;
        }
        close(report[0]);
        if (used >= 1 && buf[0] == '\0')
            return 0;
        buf[used] = '\0';
        fprintf(stderr, "%s\n", used > 0 ? buf : "the control daemon exited before it listened");
        return 1;
    }
}

/* ------------------------------------------------------------------------------------ */
/* Client                                                                                */
/* ------------------------------------------------------------------------------------ */

static int run_client(void)
{
    char input[COMMAND_MAX * 4], command[COMMAND_MAX] = "", reply[ANSWER_MAX + 2];
    struct sockaddr_un addr;
    size_t used = 0, got_len = 0;
    int commands = 0, fd;
    char *save = NULL, *line;
    ssize_t got;

    while (used < sizeof input - 1 && (got = read(0, input + used, sizeof input - 1 - used)) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            perror("stdin");
            return 1;
        }
        used += (size_t)got;
    }
    input[used] = '\0';
    for (line = strtok_r(input, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        size_t len;

        while (*line == ' ' || *line == '\t')
            line++;
        len = strlen(line);
        while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        if (!*line)
            continue;
        if (++commands == 1) {
            if (strlen(line) >= sizeof command) {
                fprintf(stderr, "fake nvidia-cuda-mps-control: command longer than %zu bytes\n", sizeof command - 1);
                return 1;
            }
            memcpy(command, line, strlen(line) + 1);
        }
    }
    if (commands == 0)
        return 0; /* an empty session, as the real shell's */
    if (commands > 1) {
        fprintf(stderr, "fake nvidia-cuda-mps-control: got %d commands on stdin; this fake takes one per run\n", commands);
        return 1;
    }

    if (join_path(g_socket_path, sizeof g_socket_path, g_pipe_dir, "control") != 0) {
        fprintf(stderr, "Cannot find MPS control daemon process\n");
        return 1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, g_socket_path, strlen(g_socket_path) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        /* The real client's words (and status 1) when nothing listens there. */
        fprintf(stderr, "Cannot find MPS control daemon process\n");
        return 1;
    }
    write_all(fd, command, strlen(command));
    write_all(fd, "\n", 1);
    shutdown(fd, SHUT_WR);
    while (got_len < sizeof reply - 1 && (got = read(fd, reply + got_len, sizeof reply - 1 - got_len)) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            break;
        got_len += (size_t)got;
    }
    close(fd);
    reply[got_len] = '\0';
    if (got_len == 0) {
        fprintf(stderr, "the MPS control daemon closed the connection without an answer\n");
        return 1;
    }
    if (reply[0] == '1') {
        fprintf(stderr, "%s\n", reply + 1);
        return 1;
    }
    fputs(reply + 1, stdout);
    return 0;
}

int main(int argc, char **argv)
{
    g_pipe_dir = env_or("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
    g_log_dir = env_or("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps");
    if (argc == 1)
        return run_client();
    if (argc == 2 && strcmp(argv[1], "-d") == 0)
        return run_background();
    if (argc == 2 && strcmp(argv[1], "-f") == 0)
        return run_foreground();
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: nvidia-cuda-mps-control [-d | -f]\n");
        return 0;
    }
    fprintf(stderr, "usage: nvidia-cuda-mps-control [-d | -f] (this fake models -d, -f and the client; got \"%s\")\n",
            argv[1]);
    return 1;
}
