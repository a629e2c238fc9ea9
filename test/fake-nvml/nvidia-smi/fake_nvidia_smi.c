/*
 * fake_nvidia_smi.c: a stand-in for NVIDIA's nvidia-smi on machines without a GPU, built by
 * test/fake-nvml/build.ts as .cache/fake-nvml/smi/nvidia-smi. It models only the command lines that
 * NVIDIA's DRA driver runs to time-slice a GPU (first the compute mode, then the time-slice, one GPU per
 * run) and the compute policy's read-back:
 *
 *   nvidia-smi -i <id> -c <mode>                         compute mode: 0|DEFAULT, 2|PROHIBITED,
 *                                                        3|EXCLUSIVE_PROCESS (also --id=, --compute-mode=)
 *   nvidia-smi compute-policy -i <id> --set-timeslice <n>
 *                                                        time-slice: 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG
 *                                                        (also --set-timeslice=<n>; no -i: every GPU)
 *   nvidia-smi compute-policy -l [-i <id>]               the current time-slice of each GPU (--list)
 *   nvidia-smi compute-policy [-h]                       the real program's help text
 *
 * <id> is a GPU's index, UUID or PCI bus id (DDDDDDDD:BB:DD.F, any case), or several of them joined
 * by commas. Anything else is refused with status 2 and a line naming what this fake does not model.
 *
 * The GPUs are the fake NVML's: the "gpus" array (uuid, name, busId, computeMode) of the JSON file
 * that FAKE_NVML_CONFIG names, so a test's node and its nvidia-smi agree. Unset or unreadable: the
 * real program's message when the driver cannot be reached, status 9.
 *
 * What the real program does that this fake reproduces: the status codes of its RETURN VALUE list
 * (0 success, 2 a bad argument or flag, 6 a GPU that was asked for and not found, 9 no driver), the
 * help text of `compute-policy`, "No devices were found" for an unknown GPU, "Invalid combination of
 * input arguments" for options that do not go together, and the compute mode's "Set compute mode to
 * <MODE> for GPU <bus id>." / "All done.". NVIDIA publishes neither the success text of
 * --set-timeslice nor the layout of --list; the fake's own (below) are marked as such, and callers
 * must read the status, never the text. Its messages go to stderr.
 *
 * Environment (fake only, for tests):
 *   FAKE_NVIDIA_SMI_STATE   the file that keeps what the driver would: each GPU's time-slice and
 *                           compute mode, {"gpus": {"GPU-…": {"timeslice": 2, "computeMode":
 *                           "DEFAULT"}, …}}, rewritten (tmp + rename, under a lock on <file>.lock)
 *                           before the program answers. A GPU not in it has time-slice 0 and its
 *                           configured compute mode. Unset: reads see those; a change is refused
 *                           (status 1), since it would be forgotten.
 *   FAKE_NVIDIA_SMI_LOG     a file that gets one line per run, appended when it ends:
 *                           {"time": "2026-11-25T11:02:03.456Z", "pid": 4242, "argv": ["compute-policy",
 *                           "-i", "GPU-…", "--set-timeslice", "2"], "status": 0}
 *   FAKE_NVIDIA_SMI_HANG    when "1", the run logs itself with "status": null and then waits until it
 *                           is killed, as nvidia-smi does on a GPU that stopped answering.
 */
#define _GNU_SOURCE

#include "../json.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 64
#define RC_OK 0
#define RC_FAILED 1 /* the fake's own refusals (no state file to keep a change in) */
#define RC_INVALID_ARGUMENT 2
#define RC_NOT_FOUND 6
#define RC_DRIVER_NOT_LOADED 9

struct gpu {
    char uuid[96];
    char name[96];
    char bus_id[32];
    int timeslice;
    int compute_mode; /* 0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS */
};

static struct gpu g_gpus[MAX_GPUS];
static int g_gpu_count;
static int g_lock_fd = -1;

static const char *const TIMESLICE_NAMES[] = { "Default", "Short", "Medium", "Long" };

static const char *compute_mode_name(int mode)
{
    switch (mode) {
    case 0:
        return "DEFAULT";
    case 2:
        return "PROHIBITED";
    case 3:
        return "EXCLUSIVE_PROCESS";
    default:
        return "UNKNOWN";
    }
}

static int compute_mode_from_text(const char *text)
{
    if (strcmp(text, "0") == 0 || strcasecmp(text, "DEFAULT") == 0)
        return 0;
    if (strcmp(text, "2") == 0 || strcasecmp(text, "PROHIBITED") == 0)
        return 2;
    if (strcmp(text, "3") == 0 || strcasecmp(text, "EXCLUSIVE_PROCESS") == 0)
        return 3;
    return -1;
}

static __attribute__((format(printf, 1, 2))) void say_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static char *read_file(const char *path, size_t *length)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t size = 0, used = 0, n;

    if (!f)
        return NULL;
    for (;;) {
        if (used + 4096 + 1 > size) {
            char *bigger = realloc(text, size = (size + 4096) * 2);

            if (!bigger) {
                free(text);
                fclose(f);
                return NULL;
            }
            text = bigger;
        }
        n = fread(text + used, 1, size - used - 1, f);
        used += n;
        if (n == 0)
            break;
    }
    fclose(f);
    text[used] = '\0';
    *length = used;
    return text;
}

static void copy_string(char *out, size_t size, const json_value *v)
{
    snprintf(out, size, "%s", v && v->type == JSON_STRING ? v->string : "");
}

/* The GPUs of the fake NVML's configuration. Returns -1 (after the real message) when there is none. */
static int load_gpus(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    const json_value *gpus;
    json_value *root = NULL;
    char error[256];
    size_t length = 0, i;
    char *text = path && path[0] ? read_file(path, &length) : NULL;

    if (text)
        root = json_parse(text, length, error, sizeof error);
    free(text);
    gpus = json_object_get(root, "gpus");
    if (!gpus || gpus->type != JSON_ARRAY) {
        json_free(root);
        say_error("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.");
        return -1;
    }
    for (i = 0; i < gpus->count && i < MAX_GPUS; i++) {
        struct gpu *g = &g_gpus[g_gpu_count++];
        const json_value *mode = json_object_get(gpus->items[i], "computeMode");

        copy_string(g->uuid, sizeof g->uuid, json_object_get(gpus->items[i], "uuid"));
        copy_string(g->name, sizeof g->name, json_object_get(gpus->items[i], "name"));
        copy_string(g->bus_id, sizeof g->bus_id, json_object_get(gpus->items[i], "busId"));
        for (char *c = g->bus_id; *c; c++)
            *c = (char)toupper((unsigned char)*c);
        g->compute_mode = mode && mode->type == JSON_NUMBER && mode->is_integer ? (int)mode->integer : 0;
    }
    json_free(root);
    return 0;
}

static struct gpu *gpu_by_uuid(const char *uuid)
{
    for (int i = 0; i < g_gpu_count; i++) {
        if (strcmp(g_gpus[i].uuid, uuid) == 0)
            return &g_gpus[i];
    }
    return NULL;
}

/* Locks the state file's lock (held until exit) and reads the state over the configured defaults. */
static void load_state(const char *path)
{
    char lock[PATH_MAX], error[256];
    json_value *root;
    const json_value *gpus;
    size_t length = 0;
    char *text;

    if (snprintf(lock, sizeof lock, "%s.lock", path) < (int)sizeof lock) {
        g_lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (g_lock_fd >= 0)
            flock(g_lock_fd, LOCK_EX);
    }
    text = read_file(path, &length);
    if (!text)
        return;
    root = json_parse(text, length, error, sizeof error);
    free(text);
    gpus = json_object_get(root, "gpus");
    for (size_t i = 0; gpus && gpus->type == JSON_OBJECT && i < gpus->count; i++) {
        struct gpu *g = gpu_by_uuid(gpus->keys[i]);
        const json_value *ts = json_object_get(gpus->items[i], "timeslice");
        const json_value *mode = json_object_get(gpus->items[i], "computeMode");

        if (!g)
            continue;
        if (ts && ts->type == JSON_NUMBER && ts->is_integer)
            g->timeslice = (int)ts->integer;
        if (mode && mode->type == JSON_STRING && compute_mode_from_text(mode->string) >= 0)
            g->compute_mode = compute_mode_from_text(mode->string);
    }
    json_free(root);
}

static int save_state(const char *path)
{
    char tmp[PATH_MAX];
    FILE *f;

    if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof tmp || !(f = fopen(tmp, "w")))
        return -1;
    fputs("{\"gpus\": {", f);
    for (int i = 0; i < g_gpu_count; i++) {
        fprintf(f, "%s\"%s\": {\"timeslice\": %d, \"computeMode\": \"%s\"}", i ? ", " : "", g_gpus[i].uuid,
                g_gpus[i].timeslice, compute_mode_name(g_gpus[i].compute_mode));
    }
    fputs("}}\n", f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Marks the GPUs an -i list names; every GPU when ids is NULL. Returns -1 when one is not found. */
static int select_gpus(const char *ids, int *selected)
{
    char copy[1024], *save = NULL, *id;

    if (!ids) {
        for (int i = 0; i < g_gpu_count; i++)
            selected[i] = 1;
        return g_gpu_count > 0 ? 0 : -1;
    }
    snprintf(copy, sizeof copy, "%s", ids);
    for (id = strtok_r(copy, ",", &save); id; id = strtok_r(NULL, ",", &save)) {
        int found = -1;
        char *end;
        long index = strtol(id, &end, 10);

        if (id[0] && *end == '\0' && index >= 0 && index < g_gpu_count)
            found = (int)index;
        for (int i = 0; found < 0 && i < g_gpu_count; i++) {
            if (strcmp(g_gpus[i].uuid, id) == 0 || strcasecmp(g_gpus[i].bus_id, id) == 0)
                found = i;
        }
        if (found < 0)
            return -1;
        selected[found] = 1;
    }
    return 0;
}

static int invalid_combination(const char *help_of)
{
    say_error("Invalid combination of input arguments. Please run 'nvidia-smi %s-h' for help.", help_of);
    return RC_INVALID_ARGUMENT;
}

static const char *state_path_for_change(void)
{
    const char *state = getenv("FAKE_NVIDIA_SMI_STATE");

    if (!state || !state[0])
        say_error("fake nvidia-smi: FAKE_NVIDIA_SMI_STATE is not set; it names the file that keeps each GPU's "
                  "time-slice and compute mode, and a change made without it would be forgotten");
    return state && state[0] ? state : NULL;
}

static int print_help(void)
{
    fputs("\n"
          "    Compute Policy -- Control and list compute policies.\n"
          "\n"
          "    Usage: nvidia-smi compute-policy [options]\n"
          "\n"
          "    Options include:\n"
          "    [-i | --id]: GPU device ID's. Provide comma\n"
          "                 separated values for more than one device\n"
          "\n"
          "    [-l | --list]: List all compute policies\n"
          "\n"
          "    [ | --set-timeslice]: Set timeslice config for a GPU:\n"
          "                          0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG\n"
          "\n"
          "    [-h | --help]: Display help information\n"
          "\n",
          stdout);
    return RC_OK;
}

/* The value of an option given as "<flag> <value>" or "<long>=<value>"; NULL when arg is not it. */
static const char *option_value(int argc, char **argv, int *i, const char *flag, const char *long_flag, int *missing)
{
    size_t long_len = strlen(long_flag);

    if ((flag && strcmp(argv[*i], flag) == 0) || strcmp(argv[*i], long_flag) == 0) {
        if (*i + 1 >= argc) {
            *missing = 1;
            return NULL;
        }
        return argv[++*i];
    }
    if (strncmp(argv[*i], long_flag, long_len) == 0 && argv[*i][long_len] == '=')
        return argv[*i] + long_len + 1;
    return NULL;
}

static int compute_policy(int argc, char **argv)
{
    const char *ids = NULL, *timeslice = NULL, *state;
    int list = 0, help = argc == 0, missing = 0, selected[MAX_GPUS] = { 0 }, value = 0;
    char *end;

    for (int i = 0; i < argc; i++) {
        const char *v;

        if ((v = option_value(argc, argv, &i, "-i", "--id", &missing)))
            ids = v;
        else if ((v = option_value(argc, argv, &i, NULL, "--set-timeslice", &missing)))
            timeslice = v;
        else if (strcmp(argv[i], "-l") == 0 || strcmp(argv[i], "--list") == 0)
            list = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            help = 1;
        else
            return invalid_combination("compute-policy ");
        if (missing)
            return invalid_combination("compute-policy ");
    }
    if (help)
        return print_help();
    if (list == (timeslice != NULL))
        return invalid_combination("compute-policy ");
    if (timeslice) {
        value = (int)strtol(timeslice, &end, 10);
        if (!isdigit((unsigned char)timeslice[0]) || *end != '\0' || value < 0 || value > 3) {
            say_error("Invalid timeslice value \"%s\". Valid values: 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG", timeslice);
            return RC_INVALID_ARGUMENT;
        }
    }
    if (load_gpus() < 0)
        return RC_DRIVER_NOT_LOADED;
    state = getenv("FAKE_NVIDIA_SMI_STATE");
    if (state && state[0])
        load_state(state);
    if (select_gpus(ids, selected) < 0) {
        say_error("No devices were found");
        return RC_NOT_FOUND;
    }
    if (list) {
        /* The fake's own layout: NVIDIA does not publish the real one. */
        for (int i = 0; i < g_gpu_count; i++) {
            if (selected[i])
                printf("GPU %s\n    Timeslice                             : %s\n", g_gpus[i].bus_id,
                       TIMESLICE_NAMES[g_gpus[i].timeslice & 3]);
        }
        return RC_OK;
    }
    if (!(state = state_path_for_change()))
        return RC_FAILED;
    for (int i = 0; i < g_gpu_count; i++) {
        if (selected[i])
            g_gpus[i].timeslice = value;
    }
    if (save_state(state) < 0) {
        say_error("fake nvidia-smi: cannot write %s: %s", state, strerror(errno));
        return RC_FAILED;
    }
    /* The fake's own wording: NVIDIA does not publish the real success text. */
    for (int i = 0; i < g_gpu_count; i++) {
        if (selected[i])
            printf("Set timeslice to %d (%s) for GPU %s.\n", value, TIMESLICE_NAMES[value], g_gpus[i].bus_id);
    }
    puts("All done.");
    return RC_OK;
}

static int compute_mode(int argc, char **argv)
{
    const char *ids = NULL, *mode_text = NULL, *state;
    int missing = 0, selected[MAX_GPUS] = { 0 }, mode;

    for (int i = 0; i < argc; i++) {
        const char *v;

        if ((v = option_value(argc, argv, &i, "-i", "--id", &missing)))
            ids = v;
        else if ((v = option_value(argc, argv, &i, "-c", "--compute-mode", &missing)))
            mode_text = v;
        else
            return -1;
        if (missing)
            return invalid_combination("");
    }
    if (!mode_text)
        return -1;
    if ((mode = compute_mode_from_text(mode_text)) < 0) {
        say_error("Invalid compute mode \"%s\". Valid values: 0/DEFAULT, 2/PROHIBITED, 3/EXCLUSIVE_PROCESS",
                  mode_text);
        return RC_INVALID_ARGUMENT;
    }
    if (load_gpus() < 0)
        return RC_DRIVER_NOT_LOADED;
    if (!(state = state_path_for_change()))
        return RC_FAILED;
    load_state(state);
    if (select_gpus(ids, selected) < 0) {
        say_error("No devices were found");
        return RC_NOT_FOUND;
    }
    for (int i = 0; i < g_gpu_count; i++) {
        if (selected[i])
            g_gpus[i].compute_mode = mode;
    }
    if (save_state(state) < 0) {
        say_error("fake nvidia-smi: cannot write %s: %s", state, strerror(errno));
        return RC_FAILED;
    }
    for (int i = 0; i < g_gpu_count; i++) {
        if (selected[i])
            printf("Set compute mode to %s for GPU %s.\n", compute_mode_name(mode), g_gpus[i].bus_id);
    }
    puts("All done.");
    return RC_OK;
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* One line for this run, appended in a single write so concurrent runs never interleave. */
static void log_run(int argc, char **argv, int status, int hanging)
{
    const char *path = getenv("FAKE_NVIDIA_SMI_LOG");
    char stamp[32], *line = NULL;
    size_t length = 0;
    struct timespec ts;
    struct tm tm;
    FILE *f;
    int fd;

    if (!path || !path[0] || !(f = open_memstream(&line, &length)))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(f, "{\"time\": \"%s.%03ldZ\", \"pid\": %ld, \"argv\": [", stamp, ts.tv_nsec / 1000000L, (long)getpid());
    for (int i = 1; i < argc; i++) {
        if (i > 1)
            fputs(", ", f);
        put_json_string(f, argv[i]);
    }
    if (hanging)
        fputs("], \"status\": null}\n", f);
    else
        fprintf(f, "], \"status\": %d}\n", status);
    fclose(f);
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, length) != (ssize_t)length)
            say_error("fake nvidia-smi: short write to %s", path);
        close(fd);
    }
    free(line);
}

int main(int argc, char **argv)
{
    const char *hang = getenv("FAKE_NVIDIA_SMI_HANG");
    int status;

    if (hang && strcmp(hang, "1") == 0) {
        log_run(argc, argv, 0, 1);
        for (;;)
            pause();
    }
    if (argc >= 2 && strcmp(argv[1], "compute-policy") == 0)
        status = compute_policy(argc - 2, argv + 2);
    else if ((status = compute_mode(argc - 1, argv + 1)) < 0) {
        say_error("fake nvidia-smi: this fake models only `-i <id> -c <mode>` and `compute-policy`; "
                  "the real program takes more");
        status = RC_INVALID_ARGUMENT;
    }
    fflush(stdout);
    log_run(argc, argv, status, 0);
    if (g_lock_fd >= 0)
        close(g_lock_fd);
    return status;
}
