/*
 * A stand-in libnvidia-ml.so.1 for the tests: the real nvidia-ml-py (pynvml) loads it exactly
 * as it loads the driver's library, so the reader's code path is the one that runs on a node.
 *
 * Built by gpuctl_tests/node/nvml_stub.py with
 *     gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 THIS_FILE
 *
 * Scripted by a text file named by $GPUCTL_NVML_STUB, read on every nvmlInit (counters reset).
 * Without that variable the library behaves like a machine whose driver is not loaded. Lines
 * ('#' starts a comment):
 *     count N                     number of GPUs (default 2, at most 64)
 *     driver 550.54.15            driver version string
 *     cuda 12040                  CUDA driver version (1000 * major + 10 * minor)
 *     nvml 12.550.54.15           NVML version string
 *     init CODE                   nvmlInit fails with this nvmlReturn_t
 *     name GPU rest of the line   product name of one GPU
 *     vbios GPU VERSION           its VBIOS version (default 96.00.99.00.01)
 *     set GPU FIELD VALUE         a number (see FIELDS below; throttle takes 0x.. too)
 *     error GPU CODE WHAT...      calls for WHAT on that GPU return CODE (3 = NOT_SUPPORTED,
 *                                 4 = NO_PERMISSION, 999 = UNKNOWN); WHAT is one of the names
 *                                 in WHATS below ("procs" fails the process lists and the
 *                                 per-process utilization, "procutil" only the latter;
 *                                 "fields" the batched nvmlDeviceGetFieldValues as a whole:
 *                                 13 = FUNCTION_NOT_FOUND, an old driver's answer. Within a
 *                                 batch, a field answers with the code of its own WHAT: ecc,
 *                                 retired, remapped; a field id it does not know is
 *                                 NOT_SUPPORTED)
 *     lost GPU N                  every call on that GPU returns GPU_IS_LOST once the GPU has
 *                                 had more than N samples (a sample = one utilization read),
 *                                 i.e. from its 0-based sample N on
 *     xid GPU XID N               an XID critical error event, delivered by nvmlEventSetWait
 *                                 once the GPU has had more than N samples
 *     proc GPU PID MIB [graphics] a running process using MIB MiB (compute unless 'graphics')
 * `set` also takes the node-shape fields of SHAPE_FIELDS (link training, NVLink, ECC mode,
 * persistence, PCI address: see "node shape" near the end of this file).
 *     procutil GPU PID SM MEM     a per-process utilization sample (SM %, memory %) that
 *                                 nvmlDeviceGetProcessUtilization returns (NOT_FOUND: none)
 * In-process tests may also change a reading while NVML is open with the non-NVML export
 * gpuctl_stub_set(gpu, field, value), and read how often a device function was called for one
 * GPU with gpuctl_stub_calls(gpu, "nvmlDeviceGetFanSpeed") (see the end of this file; counted
 * per function that checks the handle, so a pynvml call that asks twice, size then data, counts
 * two; reset by nvmlInit).
 * Default readings of GPU i are derived from i (util 50+i, temp 40+i, ...; see gpu_defaults),
 * so a test can check that the number it sees came from this library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define MAX_GPUS 64
#define MAX_PROCS 16
#define MAX_XIDS 16
#define XID_EVENT 0x8ULL
#define MIB (1024ULL * 1024ULL)

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

enum what {
    W_NAME, W_UUID, W_SERIAL, W_MEMORY, W_UTIL, W_TEMP, W_POWER, W_POWER_LIMIT, W_CLOCK,
    W_MAX_CLOCK, W_FAN, W_PSTATE, W_THROTTLE, W_ECC, W_RETIRED, W_REMAPPED, W_PROCS, W_MIG,
    W_PCIE, W_EVENTS, W_PROCUTIL, W_CODEC, W_PCIE_TPUT, W_FIELDS, W_COUNT
};
static const char *WHATS[W_COUNT] = {
    "name", "uuid", "serial", "memory", "util", "temp", "power", "power_limit", "clock",
    "max_clock", "fan", "pstate", "throttle", "ecc", "retired", "remapped", "procs", "mig",
    "pcie", "events", "procutil", "codec", "pcie_tput", "fields",
};

struct proc {
    unsigned int pid;
    unsigned long long mem;
    int graphics;
};

struct xid {
    unsigned long long xid;
    long after;
    int delivered;
};

typedef struct gpu {
    unsigned int index;
    char name[96], uuid[96], serial[32], vbios[32];
    long long v[48]; /* numeric readings, indexed by FIELDS */
    int err[W_COUNT];
    long lost_after; /* -1: never */
    long samples;
    struct proc procs[MAX_PROCS];
    int nprocs;
    struct xid xids[MAX_XIDS];
    int nxids;
    int registered; /* for XID events */
} gpu_t;

/* numeric fields settable with `set GPU FIELD VALUE` */
enum field {
    F_MEM_TOTAL_MIB, F_MEM_USED_MIB, F_UTIL_GPU, F_UTIL_MEM, F_TEMP, F_POWER_MW, F_LIMIT_MW,
    F_DEFAULT_LIMIT_MW, F_SM_CLOCK, F_MEM_CLOCK, F_MAX_SM_CLOCK, F_MAX_MEM_CLOCK, F_FAN,
    F_PSTATE, F_THROTTLE, F_ECC_VOL_CORR, F_ECC_VOL_UNC, F_ECC_AGG_CORR, F_ECC_AGG_UNC,
    F_RETIRED_SBE, F_RETIRED_DBE, F_RETIRED_PENDING, F_ROWS_CORR, F_ROWS_UNC, F_ROWS_PENDING,
    F_ROWS_FAILURE, F_MIG, F_PCIE_GEN, F_PCIE_WIDTH, F_ENC, F_DEC, F_PCIE_TX_KB, F_PCIE_RX_KB,
    F_COUNT
};
static const char *FIELDS[F_COUNT] = {
    "mem_total_mib", "mem_used_mib", "util_gpu", "util_mem", "temp", "power_mw", "limit_mw",
    "default_limit_mw", "sm_clock", "mem_clock", "max_sm_clock", "max_mem_clock", "fan",
    "pstate", "throttle", "ecc_vol_corr", "ecc_vol_unc", "ecc_agg_corr", "ecc_agg_unc",
    "retired_sbe", "retired_dbe", "retired_pending", "rows_corr", "rows_unc", "rows_pending",
    "rows_failure", "mig", "pcie_gen", "pcie_width", "enc", "dec", "pcie_tx_kb", "pcie_rx_kb",
};

/* node-shape readings (defined near the end): -1 from shape_set = no such field */
static void shape_defaults(unsigned int i);
static int shape_set(unsigned int i, const char *field, long long value);

static gpu_t gpus[MAX_GPUS];
static unsigned int ngpus;

/* calls per GPU and function (__func__ of the checked function) for gpuctl_stub_calls */
#define MAX_COUNTED 96
static struct counted {
    const char *fn;
    long n;
} counted[MAX_GPUS][MAX_COUNTED];

static void count_call(gpu_t *g, const char *fn)
{
    struct counted *c;
    int k;
    if (g == NULL || g < gpus || g >= gpus + MAX_GPUS)
        return;
    c = counted[g - gpus];
    for (k = 0; k < MAX_COUNTED && c[k].fn != NULL; k++)
        if (strcmp(c[k].fn, fn) == 0)
            break;
    if (k == MAX_COUNTED)
        return;
    c[k].fn = fn;
    c[k].n++;
}
static int initialised;
static int init_error;
static char driver_version[80], nvml_version[80];
static int cuda_version;

/* one event set is enough for the agent; more are handed out but share the queue */
static int event_sets_open;

static void gpu_defaults(gpu_t *g, unsigned int i)
{
    memset(g, 0, sizeof(*g));
    g->index = i;
    snprintf(g->name, sizeof(g->name), "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-5718a1c0-0000-4000-8000-%012u", i);
    snprintf(g->serial, sizeof(g->serial), "16500000%05u", i);
    snprintf(g->vbios, sizeof(g->vbios), "96.00.99.00.01");
    g->v[F_MEM_TOTAL_MIB] = 81559;
    g->v[F_MEM_USED_MIB] = 1024 * (10 + i);
    g->v[F_UTIL_GPU] = 50 + i;
    g->v[F_UTIL_MEM] = 20 + i;
    g->v[F_TEMP] = 40 + i;
    g->v[F_POWER_MW] = 200000 + 1000 * i;
    g->v[F_LIMIT_MW] = 700000;
    g->v[F_DEFAULT_LIMIT_MW] = 700000;
    g->v[F_SM_CLOCK] = 1755;
    g->v[F_MEM_CLOCK] = 2619;
    g->v[F_MAX_SM_CLOCK] = 1980;
    g->v[F_MAX_MEM_CLOCK] = 2619;
    g->v[F_FAN] = 30 + i;
    g->v[F_PSTATE] = 0;
    g->v[F_THROTTLE] = 0;
    g->v[F_ECC_VOL_CORR] = i;
    g->v[F_ECC_AGG_CORR] = 10 + i;
    g->v[F_ROWS_CORR] = i;
    g->v[F_PCIE_GEN] = 5;
    g->v[F_PCIE_WIDTH] = 16;
    g->v[F_ENC] = 5 + i;
    g->v[F_DEC] = 7 + i;
    g->v[F_PCIE_TX_KB] = 1000 + i;
    g->v[F_PCIE_RX_KB] = 2000 + i;
    g->lost_after = -1;
}

static int lookup(const char *word, const char **table, int n)
{
    int k;
    for (k = 0; k < n; k++)
        if (strcmp(word, table[k]) == 0)
            return k;
    return -1;
}

static gpu_t *gpu_arg(const char *tok)
{
    long i;
    if (tok == NULL)
        return NULL;
    i = strtol(tok, NULL, 10);
    if (i < 0 || i >= MAX_GPUS)
        return NULL;
    return &gpus[i];
}

/* ---- per-process utilization (procutil lines, nvmlDeviceGetProcessUtilization) ---------- */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

static struct procutil {
    unsigned int gpu, pid, sm, mem;
} procutils[MAX_GPUS * MAX_PROCS];
static int nprocutils;

static void procutil_line(gpu_t *g, char **save)
{
    char *pid = strtok_r(NULL, " \t", save), *sm = strtok_r(NULL, " \t", save);
    char *mem = strtok_r(NULL, " \t", save);
    struct procutil *u;
    if (g == NULL || pid == NULL || sm == NULL || nprocutils >= MAX_GPUS * MAX_PROCS)
        return;
    u = &procutils[nprocutils++];
    u->gpu = g->index;
    u->pid = (unsigned int)strtoul(pid, NULL, 10);
    u->sm = (unsigned int)strtoul(sm, NULL, 10);
    u->mem = mem ? (unsigned int)strtoul(mem, NULL, 10) : 0;
}

static void load_config(void)
{
    const char *path = getenv("GPUCTL_NVML_STUB");
    char line[512];
    FILE *f;
    unsigned int i;

    ngpus = 2;
    nprocutils = 0;
    memset(counted, 0, sizeof(counted));
    init_error = 0;
    cuda_version = 12040;
    snprintf(driver_version, sizeof(driver_version), "550.54.15");
    snprintf(nvml_version, sizeof(nvml_version), "12.550.54.15");
    for (i = 0; i < MAX_GPUS; i++) {
        gpu_defaults(&gpus[i], i);
        shape_defaults(i);
    }
    if (path == NULL || *path == '\0') {
        init_error = NVML_ERROR_DRIVER_NOT_LOADED;
        return;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        init_error = NVML_ERROR_UNKNOWN;
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *save = NULL, *key, *hash = strchr(line, '#');
        gpu_t *g;
        if (hash)
            *hash = '\0';
        line[strcspn(line, "\r\n")] = '\0';
        key = strtok_r(line, " \t", &save);
        if (key == NULL)
            continue;
        if (strcmp(key, "count") == 0) {
            char *tok = strtok_r(NULL, " \t", &save);
            long n = tok ? strtol(tok, NULL, 10) : 0;
            ngpus = (unsigned int)(n < 0 ? 0 : n > MAX_GPUS ? MAX_GPUS : n);
        } else if (strcmp(key, "driver") == 0 || strcmp(key, "nvml") == 0) {
            char *tok = strtok_r(NULL, " \t", &save);
            char *dst = key[0] == 'd' ? driver_version : nvml_version;
            snprintf(dst, 80, "%s", tok ? tok : "");
        } else if (strcmp(key, "cuda") == 0) {
            char *tok = strtok_r(NULL, " \t", &save);
            cuda_version = tok ? (int)strtol(tok, NULL, 10) : 0;
        } else if (strcmp(key, "init") == 0) {
            char *tok = strtok_r(NULL, " \t", &save);
            init_error = tok ? (int)strtol(tok, NULL, 10) : NVML_ERROR_UNKNOWN;
        } else if (strcmp(key, "name") == 0) {
            char *rest;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            rest = strtok_r(NULL, "", &save);
            if (g && rest)
                snprintf(g->name, sizeof(g->name), "%s", rest);
        } else if (strcmp(key, "vbios") == 0) {
            char *rest;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            rest = strtok_r(NULL, " \t", &save);
            if (g && rest)
                snprintf(g->vbios, sizeof(g->vbios), "%s", rest);
        } else if (strcmp(key, "set") == 0) {
            char *field, *value;
            int k;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            field = strtok_r(NULL, " \t", &save);
            value = strtok_r(NULL, " \t", &save);
            if (g && field && value && (k = lookup(field, FIELDS, F_COUNT)) >= 0)
                g->v[k] = strtoll(value, NULL, 0);
            else if (g && field && value)
                shape_set(g->index, field, strtoll(value, NULL, 0));
        } else if (strcmp(key, "error") == 0) {
            char *tok;
            int code;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            tok = strtok_r(NULL, " \t", &save);
            code = tok ? (int)strtol(tok, NULL, 10) : NVML_ERROR_UNKNOWN;
            while (g && (tok = strtok_r(NULL, " \t", &save)) != NULL) {
                int w = lookup(tok, WHATS, W_COUNT);
                if (w >= 0)
                    g->err[w] = code;
            }
        } else if (strcmp(key, "lost") == 0) {
            char *tok;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            tok = strtok_r(NULL, " \t", &save);
            if (g)
                g->lost_after = tok ? strtol(tok, NULL, 10) : 0;
        } else if (strcmp(key, "xid") == 0) {
            char *x, *after;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            x = strtok_r(NULL, " \t", &save);
            after = strtok_r(NULL, " \t", &save);
            if (g && x && g->nxids < MAX_XIDS) {
                g->xids[g->nxids].xid = strtoull(x, NULL, 10);
                g->xids[g->nxids].after = after ? strtol(after, NULL, 10) : 0;
                g->xids[g->nxids].delivered = 0;
                g->nxids++;
            }
        } else if (strcmp(key, "procutil") == 0) {
            procutil_line(gpu_arg(strtok_r(NULL, " \t", &save)), &save);
        } else if (strcmp(key, "proc") == 0) {
            char *pid, *mib, *kind;
            g = gpu_arg(strtok_r(NULL, " \t", &save));
            pid = strtok_r(NULL, " \t", &save);
            mib = strtok_r(NULL, " \t", &save);
            kind = strtok_r(NULL, " \t", &save);
            if (g && pid && mib && g->nprocs < MAX_PROCS) {
                struct proc *p = &g->procs[g->nprocs++];
                p->pid = (unsigned int)strtoul(pid, NULL, 10);
                p->mem = strtoull(mib, NULL, 10) * MIB;
                p->graphics = kind != NULL && strcmp(kind, "graphics") == 0;
            }
        }
    }
    fclose(f);
}

/* Every device call starts here: the handle must be ours, NVML initialised, the GPU on the
 * bus, and the call not scripted to fail. */
static nvmlReturn_t check(gpu_t *g, int what)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (g == NULL || g < gpus || g >= gpus + ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost_after >= 0 && g->samples > g->lost_after)
        return NVML_ERROR_GPU_IS_LOST;
    if (what >= 0 && g->err[what])
        return g->err[what];
    return NVML_SUCCESS;
}

#define CHECK(g, what)                      \
    do {                                    \
        nvmlReturn_t rc_;                   \
        count_call((g), __func__);          \
        rc_ = check((g), (what));           \
        if (rc_ != NVML_SUCCESS)            \
            return rc_;                     \
    } while (0)

static nvmlReturn_t copy_string(char *dst, unsigned int size, const char *src)
{
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init ----------------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    load_config();
    if (init_error)
        return init_error;
    initialised = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/* ---- system --------------------------------------------------------------------------- */
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

/* ---- devices -------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = ngpus;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, gpu_t **device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= ngpus || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, gpu_t **device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(gpu_t *g, unsigned int *index)
{
    CHECK(g, -1);
    *index = g->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(gpu_t *g, char *name, unsigned int length)
{
    CHECK(g, W_NAME);
    return copy_string(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(gpu_t *g, char *version, unsigned int length)
{
    CHECK(g, W_NAME);
    return copy_string(version, length, g->vbios);
}

nvmlReturn_t nvmlDeviceGetUUID(gpu_t *g, char *uuid, unsigned int length)
{
    CHECK(g, W_UUID);
    return copy_string(uuid, length, g->uuid);
}

nvmlReturn_t nvmlDeviceGetSerial(gpu_t *g, char *serial, unsigned int length)
{
    CHECK(g, W_SERIAL);
    return copy_string(serial, length, g->serial);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(gpu_t *g, nvmlMemory_t *m)
{
    CHECK(g, W_MEMORY);
    m->total = (unsigned long long)g->v[F_MEM_TOTAL_MIB] * MIB;
    m->used = (unsigned long long)g->v[F_MEM_USED_MIB] * MIB;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(gpu_t *g, nvmlMemory_v2_t *m)
{
    CHECK(g, W_MEMORY);
    m->total = (unsigned long long)g->v[F_MEM_TOTAL_MIB] * MIB;
    m->reserved = 0;
    m->used = (unsigned long long)g->v[F_MEM_USED_MIB] * MIB;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(gpu_t *g, nvmlUtilization_t *u)
{
    nvmlReturn_t rc = check(g, -1);
    if (rc == NVML_SUCCESS || rc == NVML_ERROR_GPU_IS_LOST)
        g->samples++; /* the sample counter that `lost` and `xid` lines count */
    CHECK(g, W_UTIL);
    u->gpu = (unsigned int)g->v[F_UTIL_GPU];
    u->memory = (unsigned int)g->v[F_UTIL_MEM];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(gpu_t *g, int sensor, unsigned int *temp)
{
    CHECK(g, W_TEMP);
    if (sensor != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)g->v[F_TEMP];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(gpu_t *g, unsigned int *mw)
{
    CHECK(g, W_POWER);
    *mw = (unsigned int)g->v[F_POWER_MW];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(gpu_t *g, unsigned int *mw)
{
    CHECK(g, W_POWER_LIMIT);
    *mw = (unsigned int)g->v[F_LIMIT_MW];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(gpu_t *g, unsigned int *mw)
{
    return nvmlDeviceGetEnforcedPowerLimit(g, mw);
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(gpu_t *g, unsigned int *mw)
{
    CHECK(g, W_POWER_LIMIT);
    *mw = (unsigned int)g->v[F_DEFAULT_LIMIT_MW];
    return NVML_SUCCESS;
}

/* clock types: 0 graphics, 1 SM, 2 memory */
nvmlReturn_t nvmlDeviceGetClockInfo(gpu_t *g, int type, unsigned int *mhz)
{
    CHECK(g, W_CLOCK);
    if (type == 0 || type == 1)
        *mhz = (unsigned int)g->v[F_SM_CLOCK];
    else if (type == 2)
        *mhz = (unsigned int)g->v[F_MEM_CLOCK];
    else
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(gpu_t *g, int type, unsigned int *mhz)
{
    CHECK(g, W_MAX_CLOCK);
    if (type == 0 || type == 1)
        *mhz = (unsigned int)g->v[F_MAX_SM_CLOCK];
    else if (type == 2)
        *mhz = (unsigned int)g->v[F_MAX_MEM_CLOCK];
    else
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFanSpeed(gpu_t *g, unsigned int *pct)
{
    CHECK(g, W_FAN);
    *pct = (unsigned int)g->v[F_FAN];
    return NVML_SUCCESS;
}

/* codec: both the video encoder and decoder utilization ("error GPU 3 codec") */
nvmlReturn_t nvmlDeviceGetEncoderUtilization(gpu_t *g, unsigned int *pct, unsigned int *period_us)
{
    CHECK(g, W_CODEC);
    *pct = (unsigned int)g->v[F_ENC];
    *period_us = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(gpu_t *g, unsigned int *pct, unsigned int *period_us)
{
    CHECK(g, W_CODEC);
    *pct = (unsigned int)g->v[F_DEC];
    *period_us = 167000;
    return NVML_SUCCESS;
}

/* counter 0: TX bytes, 1: RX bytes (nvmlPcieUtilCounter_t); KB/s as NVML answers */
nvmlReturn_t nvmlDeviceGetPcieThroughput(gpu_t *g, int counter, unsigned int *kb_per_s)
{
    CHECK(g, W_PCIE_TPUT);
    if (counter != 0 && counter != 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *kb_per_s = (unsigned int)g->v[counter == 0 ? F_PCIE_TX_KB : F_PCIE_RX_KB];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPerformanceState(gpu_t *g, int *pstate)
{
    CHECK(g, W_PSTATE);
    *pstate = (int)g->v[F_PSTATE];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(gpu_t *g, unsigned long long *mask)
{
    CHECK(g, W_THROTTLE);
    *mask = (unsigned long long)g->v[F_THROTTLE];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(gpu_t *g, unsigned long long *mask)
{
    return nvmlDeviceGetCurrentClocksEventReasons(g, mask);
}

/* errorType: 0 corrected, 1 uncorrected; counterType: 0 volatile, 1 aggregate */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(gpu_t *g, int error_type, int counter_type,
                                         unsigned long long *count)
{
    CHECK(g, W_ECC);
    if (error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned long long)g->v[F_ECC_VOL_CORR + 2 * counter_type + error_type];
    return NVML_SUCCESS;
}

/* cause: 0 multiple single-bit errors, 1 double-bit error */
nvmlReturn_t nvmlDeviceGetRetiredPages(gpu_t *g, int cause, unsigned int *count,
                                       unsigned long long *addresses)
{
    unsigned int n, k;
    CHECK(g, W_RETIRED);
    if (cause < 0 || cause > 1 || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    n = (unsigned int)g->v[cause == 0 ? F_RETIRED_SBE : F_RETIRED_DBE];
    if (addresses == NULL || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (k = 0; k < n; k++)
        addresses[k] = 0x1000ULL * (k + 1) + (unsigned long long)cause;
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(gpu_t *g, int *pending)
{
    CHECK(g, W_RETIRED);
    *pending = g->v[F_RETIRED_PENDING] ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(gpu_t *g, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure)
{
    CHECK(g, W_REMAPPED);
    *corr = (unsigned int)g->v[F_ROWS_CORR];
    *unc = (unsigned int)g->v[F_ROWS_UNC];
    *pending = (unsigned int)g->v[F_ROWS_PENDING];
    *failure = (unsigned int)g->v[F_ROWS_FAILURE];
    return NVML_SUCCESS;
}

/* nvmlDeviceGetFieldValues: many readings in one call, each with its own return code. */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType; /* 1 unsigned int, 3 unsigned long long */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* the field ids this library answers (nvml.h NVML_FI_DEV_*): its reading and its WHAT */
static const struct {
    unsigned int id;
    int field, what;
} FIELD_IDS[] = {
    {3, F_ECC_VOL_CORR, W_ECC},     {4, F_ECC_VOL_UNC, W_ECC},      {5, F_ECC_AGG_CORR, W_ECC},
    {6, F_ECC_AGG_UNC, W_ECC},      {29, F_RETIRED_SBE, W_RETIRED}, {30, F_RETIRED_DBE, W_RETIRED},
    {31, F_RETIRED_PENDING, W_RETIRED}, {142, F_ROWS_CORR, W_REMAPPED},
    {143, F_ROWS_UNC, W_REMAPPED},  {144, F_ROWS_PENDING, W_REMAPPED},
    {145, F_ROWS_FAILURE, W_REMAPPED},
};

nvmlReturn_t nvmlDeviceGetFieldValues(gpu_t *g, int count, nvmlFieldValue_t *values)
{
    int k;
    size_t j;
    CHECK(g, W_FIELDS);
    if (count < 0 || (count > 0 && values == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        v->timestamp = 0;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (j = 0; j < sizeof(FIELD_IDS) / sizeof(FIELD_IDS[0]); j++) {
            if (FIELD_IDS[j].id != v->fieldId)
                continue;
            if (g->err[FIELD_IDS[j].what]) {
                v->nvmlReturn = g->err[FIELD_IDS[j].what];
            } else if (FIELD_IDS[j].what == W_REMAPPED) {
                v->nvmlReturn = NVML_SUCCESS;
                v->valueType = 1;
                v->value.uiVal = (unsigned int)g->v[FIELD_IDS[j].field];
            } else {
                v->nvmlReturn = NVML_SUCCESS;
                v->valueType = 3;
                v->value.ullVal = (unsigned long long)g->v[FIELD_IDS[j].field];
            }
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(gpu_t *g, unsigned int *gen)
{
    CHECK(g, W_PCIE);
    *gen = (unsigned int)g->v[F_PCIE_GEN];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(gpu_t *g, unsigned int *width)
{
    CHECK(g, W_PCIE);
    *width = (unsigned int)g->v[F_PCIE_WIDTH];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(gpu_t *g, unsigned int *current, unsigned int *pending)
{
    CHECK(g, W_MIG);
    *current = (unsigned int)g->v[F_MIG];
    *pending = (unsigned int)g->v[F_MIG];
    return NVML_SUCCESS;
}

/* The NVML contract: count in = room in infos; NULL infos or too little room gives
 * INSUFFICIENT_SIZE with the count needed; no processes gives SUCCESS with count 0. */
static nvmlReturn_t processes(gpu_t *g, int graphics, unsigned int *count, void *infos,
                              size_t stride)
{
    unsigned int n = 0, k = 0;
    int i;
    CHECK(g, W_PROCS);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < g->nprocs; i++)
        n += g->procs[i].graphics == graphics;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < g->nprocs; i++) {
        nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)((char *)infos + stride * k);
        if (g->procs[i].graphics != graphics)
            continue;
        p->pid = g->procs[i].pid;
        p->usedGpuMemory = g->procs[i].mem;
        if (stride == sizeof(nvmlProcessInfo_v2_t)) {
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}

#define PROCESS_FUNCTIONS(kind, graphics)                                                      \
    nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v3(gpu_t *g, unsigned int *count,       \
                                                          nvmlProcessInfo_v2_t *infos)        \
    {                                                                                          \
        count_call(g, __func__);                                                               \
        return processes(g, graphics, count, infos, sizeof(nvmlProcessInfo_v2_t));             \
    }                                                                                          \
    nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v2(gpu_t *g, unsigned int *count,       \
                                                          nvmlProcessInfo_v2_t *infos)        \
    {                                                                                          \
        return processes(g, graphics, count, infos, sizeof(nvmlProcessInfo_v2_t));             \
    }                                                                                          \
    nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses(gpu_t *g, unsigned int *count,          \
                                                       nvmlProcessInfo_v1_t *infos)           \
    {                                                                                          \
        return processes(g, graphics, count, infos, sizeof(nvmlProcessInfo_v1_t));             \
    }

PROCESS_FUNCTIONS(Compute, 0)
PROCESS_FUNCTIONS(Graphics, 1)

/* Samples of `procutil` lines for this GPU, stamped with the GPU's sample count; the NVML
 * contract of the process list (NULL or too small a buffer: INSUFFICIENT_SIZE and the count). */
nvmlReturn_t nvmlDeviceGetProcessUtilization(gpu_t *g, nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count, unsigned long long since)
{
    unsigned int n = 0, k = 0;
    int i;
    (void)since;
    CHECK(g, W_PROCS);
    if (g->err[W_PROCUTIL])
        return g->err[W_PROCUTIL];
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < nprocutils; i++)
        n += procutils[i].gpu == g->index;
    if (n == 0)
        return 6; /* NVML_ERROR_NOT_FOUND: no sample since `since` */
    if (out == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < nprocutils; i++) {
        if (procutils[i].gpu != g->index)
            continue;
        memset(&out[k], 0, sizeof(out[k]));
        out[k].pid = procutils[i].pid;
        out[k].timeStamp = 1000000ULL * (unsigned long long)(g->samples + 1);
        out[k].smUtil = procutils[i].sm;
        out[k].memUtil = procutils[i].mem;
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* ---- events --------------------------------------------------------------------------- */
typedef struct {
    gpu_t *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static int event_set_token;

nvmlReturn_t nvmlEventSetCreate(void **set)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    event_sets_open++;
    *set = &event_set_token;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(void *set)
{
    if (set != &event_set_token)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (event_sets_open > 0)
        event_sets_open--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(gpu_t *g, unsigned long long *types)
{
    CHECK(g, W_EVENTS);
    *types = XID_EVENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(gpu_t *g, unsigned long long types, void *set)
{
    CHECK(g, W_EVENTS);
    if (set != &event_set_token)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~XID_EVENT)
        return NVML_ERROR_NOT_SUPPORTED;
    g->registered = 1;
    return NVML_SUCCESS;
}

/* Never blocks: a scripted XID that is due is returned, else TIMEOUT (the agent polls with 0). */
nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    unsigned int i;
    int k;
    (void)timeout_ms;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (set != &event_set_token || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < ngpus; i++) {
        gpu_t *g = &gpus[i];
        if (!g->registered)
            continue;
        for (k = 0; k < g->nxids; k++) {
            struct xid *x = &g->xids[k];
            if (x->delivered || g->samples <= x->after)
                continue;
            x->delivered = 1;
            data->device = g;
            data->eventType = XID_EVENT;
            data->eventData = x->xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait(void *set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* ---- test control (not NVML) ---------------------------------------------------------- */
/* Change a reading while NVML is open, for in-process tests: 0 on success, -1 for a bad GPU
 * or field name ("lost" sets the lost-after sample count, like the `lost` line). */
int gpuctl_stub_set(unsigned int index, const char *field, long long value)
{
    int k;
    if (index >= MAX_GPUS || field == NULL)
        return -1;
    if (strcmp(field, "lost") == 0) {
        gpus[index].lost_after = (long)value;
        return 0;
    }
    k = lookup(field, FIELDS, F_COUNT);
    if (k < 0)
        return shape_set(index, field, value);
    gpus[index].v[k] = value;
    return 0;
}

/* How often FN (a device function's name) was called for GPU INDEX since nvmlInit. */
long gpuctl_stub_calls(unsigned int index, const char *fn)
{
    int k;
    if (index >= MAX_GPUS || fn == NULL)
        return -1;
    for (k = 0; k < MAX_COUNTED && counted[index][k].fn != NULL; k++)
        if (strcmp(counted[index][k].fn, fn) == 0)
            return counted[index][k].n;
    return 0;
}

/* ---- node shape (acceptance): link training, NVLink, ECC mode, persistence, PCI address ---- */
/* Kept apart from FIELDS: `set GPU FIELD VALUE` falls back to these names. */
enum shape_field {
    S_CURR_PCIE_GEN, S_CURR_PCIE_WIDTH, S_GPU_MAX_PCIE_GEN, S_NVLINKS, S_NVLINKS_ACTIVE,
    S_ECC_MODE, S_ECC_PENDING, S_PERSISTENCE, S_PCI_DOMAIN, S_PCI_BUS,
    S_NVLINK_REPLAY, S_NVLINK_RECOVERY, S_NVLINK_CRC_FLIT, S_NVLINK_CRC_DATA, S_PCIE_REPLAY,
    S_COUNTER_GROW, S_COUNT
};
/* curr_pcie_gen/width -1: the link runs at its maximum (pcie_gen/pcie_width);
 * gpu_max_pcie_gen -1: as pcie_gen; nvlinks: links the GPU has (0: NVLink NOT_SUPPORTED), the
 * first nvlinks_active of them are up (-1: all); ecc_mode/persistence -1: NOT_SUPPORTED;
 * ecc_pending -1: as ecc_mode. The PCI address is DOMAIN:BUS:00.0.
 * Link error counters: nvlink_replay, nvlink_recovery, nvlink_crc_flit, nvlink_crc_data (NVLink
 * link 0's; the other links count 0) and pcie_replay start at the value set (default 0); every
 * read of a counter set above 0, after its first read, adds counter_grow to it, so a test sets
 * which counter grows and by how much between the suite's reading before the load and after. */
static const char *SHAPE_FIELDS[S_COUNT] = {
    "curr_pcie_gen", "curr_pcie_width", "gpu_max_pcie_gen", "nvlinks", "nvlinks_active",
    "ecc_mode", "ecc_pending", "persistence", "pci_domain", "pci_bus",
    "nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data", "pcie_replay",
    "counter_grow",
};
static long long shape[MAX_GPUS][S_COUNT];
static long long counter_reads[MAX_GPUS][S_COUNT];

static void shape_defaults(unsigned int i)
{
    long long *s = shape[i];
    s[S_CURR_PCIE_GEN] = -1;
    s[S_CURR_PCIE_WIDTH] = -1;
    s[S_GPU_MAX_PCIE_GEN] = -1;
    s[S_NVLINKS] = 18; /* an H100 SXM */
    s[S_NVLINKS_ACTIVE] = -1;
    s[S_ECC_MODE] = 1;
    s[S_ECC_PENDING] = -1;
    s[S_PERSISTENCE] = 1;
    s[S_PCI_DOMAIN] = 0;
    s[S_PCI_BUS] = 0x18 + 0x10 * (long long)i;
    s[S_NVLINK_REPLAY] = s[S_NVLINK_RECOVERY] = s[S_NVLINK_CRC_FLIT] = s[S_NVLINK_CRC_DATA] = 0;
    s[S_PCIE_REPLAY] = s[S_COUNTER_GROW] = 0;
    memset(counter_reads[i], 0, sizeof(counter_reads[i]));
}

/* A link error counter of GPU g: its value, grown (when above 0) by counter_grow at every read
 * after the first. */
static unsigned long long counter_read(gpu_t *g, int k)
{
    long long v = shape[g->index][k];
    if (v > 0)
        v += shape[g->index][S_COUNTER_GROW] * counter_reads[g->index][k];
    counter_reads[g->index][k]++;
    return (unsigned long long)(v < 0 ? 0 : v);
}

/* nvmlNvLinkErrorCounter_t: 0 DL_REPLAY, 1 DL_RECOVERY, 2 DL_CRC_FLIT, 3 DL_CRC_DATA */
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(gpu_t *g, unsigned int link, int counter,
                                             unsigned long long *value)
{
    static const int kinds[4] = {S_NVLINK_REPLAY, S_NVLINK_RECOVERY, S_NVLINK_CRC_FLIT,
                                 S_NVLINK_CRC_DATA};
    long long n;
    CHECK(g, -1);
    n = shape[g->index][S_NVLINKS];
    if (n <= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (value == NULL || (long long)link >= n || counter < 0 || counter > 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (counter == 4)
        return NVML_ERROR_NOT_SUPPORTED; /* DL_ECC_DATA: not on this part */
    *value = link == 0 ? counter_read(g, kinds[counter]) : 0ULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(gpu_t *g, unsigned int *value)
{
    CHECK(g, W_PCIE);
    if (value == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *value = (unsigned int)counter_read(g, S_PCIE_REPLAY);
    return NVML_SUCCESS;
}

static int shape_set(unsigned int i, const char *field, long long value)
{
    int k = lookup(field, SHAPE_FIELDS, S_COUNT);
    if (i >= MAX_GPUS || k < 0)
        return -1;
    shape[i][k] = value;
    return 0;
}

static long long shape_or(gpu_t *g, int k, long long fallback)
{
    long long v = shape[g->index][k];
    return v < 0 ? fallback : v;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(gpu_t *g, unsigned int *gen)
{
    CHECK(g, W_PCIE);
    *gen = (unsigned int)shape_or(g, S_CURR_PCIE_GEN, g->v[F_PCIE_GEN]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(gpu_t *g, unsigned int *width)
{
    CHECK(g, W_PCIE);
    *width = (unsigned int)shape_or(g, S_CURR_PCIE_WIDTH, g->v[F_PCIE_WIDTH]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(gpu_t *g, unsigned int *gen)
{
    CHECK(g, W_PCIE);
    *gen = (unsigned int)shape_or(g, S_GPU_MAX_PCIE_GEN, g->v[F_PCIE_GEN]);
    return NVML_SUCCESS;
}

/* nvmlEnableState_t: 0 disabled, 1 enabled */
nvmlReturn_t nvmlDeviceGetNvLinkState(gpu_t *g, unsigned int link, unsigned int *active)
{
    long long n;
    CHECK(g, -1);
    n = shape[g->index][S_NVLINKS];
    if (n <= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (active == NULL || (long long)link >= n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = (long long)link < shape_or(g, S_NVLINKS_ACTIVE, n) ? 1u : 0u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(gpu_t *g, unsigned int *current, unsigned int *pending)
{
    long long mode;
    CHECK(g, W_ECC);
    mode = shape[g->index][S_ECC_MODE];
    if (mode < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)mode;
    *pending = (unsigned int)shape_or(g, S_ECC_PENDING, mode);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(gpu_t *g, unsigned int *mode)
{
    CHECK(g, -1);
    if (shape[g->index][S_PERSISTENCE] < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *mode = (unsigned int)shape[g->index][S_PERSISTENCE];
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(gpu_t *g, nvmlPciInfo_t *pci)
{
    CHECK(g, -1);
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->domain = (unsigned int)shape[g->index][S_PCI_DOMAIN];
    pci->bus = (unsigned int)shape[g->index][S_PCI_BUS];
    pci->pciDeviceId = 0x233010deu;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:00.0", pci->domain, pci->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:00.0", pci->domain & 0xffff,
             pci->bus);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(gpu_t *g, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(g, pci);
}
