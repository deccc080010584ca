/*
 * A stand-in libnvidia-ml.so.1 for nodeguard's tests: the real nvidia-ml-py (pynvml) loads it
 * through LD_LIBRARY_PATH and calls it exactly as it calls the driver's NVML.
 *
 * Only the functions nodeguard's GPU source calls are here, with the C signatures and struct
 * layouts of nvml.h as pynvml declares them (nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t).
 * What the "driver" reports comes from a scenario file named by $NVML_STUB_SCENARIO, read at
 * nvmlInitWithFlags; one directive a line, '#' starts a comment:
 *
 *   init RC                      nvmlInit returns RC (0: success)
 *   count_rc RC                  nvmlDeviceGetCount returns RC
 *   driver VERSION               nvmlSystemGetDriverVersion
 *   gpu I UUID TOTAL RESERVED USED FREE MIG NAME...
 *                                device I; MIG is 0, 1, or -1 (mode query NOT_SUPPORTED);
 *                                bytes as memory info v2 gives them (v1's used = USED+RESERVED)
 *   mig I SLOT UUID GI CI TOTAL RESERVED USED FREE
 *                                a MIG device of GPU I at handle index SLOT
 *   proc I SLOT PID USED [LIST]  a process on GPU I (SLOT -1) or on its MIG device SLOT, in the
 *                                list LIST: compute (the default), graphics or mps; USED is
 *                                bytes or "na" (NVML_VALUE_NOT_AVAILABLE). A PID may be in
 *                                several lists, with an amount in each.
 *   fail I CALL RC               calls on GPU I return RC; CALL is mem (v1 and v2), mem_v2,
 *                                procs (the compute list), graphics_procs, mps_procs, uuid,
 *                                name or mig
 *   lost I PATH                  once PATH exists, every call on GPU I returns GPU_IS_LOST
 *
 * The graphics list of a MIG device answers NOT_SUPPORTED (MIG has no graphics contexts).
 * Build variants drop symbols, as older drivers lack them: -DNO_PROCS_V3 (no _v3 of the three
 * process lists: nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v3), -DNO_PROCS_V2
 * (no _v2 of them), -DNO_MPS (no MPS list at all), -DNO_MEMORY_V2 (no
 * nvmlDeviceGetMemoryInfo_v2).
 * With $NVML_STUB_LOG set, init and shutdown append a line there, so tests can count them.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 8
#define MAX_MIG 8
#define MAX_PROCS 64
enum { LIST_COMPUTE, LIST_GRAPHICS, LIST_MPS, LISTS };
static const char *const list_names[LISTS] = {"compute", "graphics", "mps"};
#define NA_UINT 0xFFFFFFFFu
#define NA_ULL 0xFFFFFFFFFFFFFFFFull
#define MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct mem {
    unsigned long long total, reserved, used, free;
};

struct node { /* what an nvmlDevice_t points at: a GPU (slot -1) or one of its MIG devices */
    int gpu, slot, present;
    char uuid[96];
    unsigned int gi, ci;
    struct mem mem;
};
typedef struct node *nvmlDevice_t;

struct gpu {
    struct node node;
    char name[96];
    int mig_mode; /* 0, 1, -1: not supported */
    int rc_mem, rc_mem_v2, rc_uuid, rc_name, rc_mig;
    int rc_procs[LISTS]; /* per list: compute, graphics, mps */
    char lost_path[512];
    struct node migs[MAX_MIG];
};

struct proc {
    int gpu, slot, list;
    unsigned int pid;
    unsigned long long used;
};

static struct gpu gpus[MAX_GPUS];
static int gpu_count;
static struct proc procs[MAX_PROCS];
static int proc_count;
static int init_rc, count_rc, initialised;
static char driver[80] = "999.99.99";

static void log_call(const char *what) {
    const char *path = getenv("NVML_STUB_LOG");
    if (!path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    char line[64];
    int n = snprintf(line, sizeof line, "%s %d\n", what, (int)getpid());
    if (write(fd, line, (size_t)n) < 0) { /* nothing to do */ }
    close(fd);
}

static int parse(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char word[16] = "";
        int i, slot, rc, off = 0;
        if (sscanf(line, "%15s", word) != 1) continue;
        if (!strcmp(word, "init")) {
            sscanf(line, "%*s %d", &init_rc);
        } else if (!strcmp(word, "count_rc")) {
            sscanf(line, "%*s %d", &count_rc);
        } else if (!strcmp(word, "driver")) {
            sscanf(line, "%*s %79s", driver);
        } else if (!strcmp(word, "gpu")) {
            struct gpu g = {0};
            if (sscanf(line, "%*s %d %95s %llu %llu %llu %llu %d %n", &i, g.node.uuid,
                       &g.node.mem.total, &g.node.mem.reserved, &g.node.mem.used,
                       &g.node.mem.free, &g.mig_mode, &off) < 7 || i < 0 || i >= MAX_GPUS)
                goto bad;
            snprintf(g.name, sizeof g.name, "%s", line + off);
            g.node.gpu = i;
            g.node.slot = -1;
            g.node.present = 1;
            for (int s = 0; s < MAX_MIG; s++) g.migs[s].gpu = i, g.migs[s].slot = s;
            gpus[i] = g;
            if (i + 1 > gpu_count) gpu_count = i + 1;
        } else if (!strcmp(word, "mig")) {
            struct node m = {0};
            if (sscanf(line, "%*s %d %d %95s %u %u %llu %llu %llu %llu", &i, &slot, m.uuid, &m.gi,
                       &m.ci, &m.mem.total, &m.mem.reserved, &m.mem.used, &m.mem.free) != 9 ||
                i < 0 || i >= MAX_GPUS || slot < 0 || slot >= MAX_MIG)
                goto bad;
            m.gpu = i;
            m.slot = slot;
            m.present = 1;
            gpus[i].migs[slot] = m;
        } else if (!strcmp(word, "proc")) {
            char used[32], list[16] = "compute";
            struct proc p;
            if (proc_count >= MAX_PROCS ||
                sscanf(line, "%*s %d %d %u %31s %15s", &p.gpu, &p.slot, &p.pid, used, list) < 4)
                goto bad;
            for (p.list = 0; p.list < LISTS && strcmp(list, list_names[p.list]); p.list++) {}
            if (p.list == LISTS) goto bad;
            p.used = strcmp(used, "na") ? strtoull(used, NULL, 10) : NA_ULL;
            procs[proc_count++] = p;
        } else if (!strcmp(word, "fail")) {
            char call[24];
            if (sscanf(line, "%*s %d %23s %d", &i, call, &rc) != 3 || i < 0 || i >= MAX_GPUS)
                goto bad;
            struct gpu *g = &gpus[i];
            if (!strcmp(call, "mem")) g->rc_mem = rc;
            else if (!strcmp(call, "mem_v2")) g->rc_mem_v2 = rc;
            else if (!strcmp(call, "procs")) g->rc_procs[LIST_COMPUTE] = rc;
            else if (!strcmp(call, "graphics_procs")) g->rc_procs[LIST_GRAPHICS] = rc;
            else if (!strcmp(call, "mps_procs")) g->rc_procs[LIST_MPS] = rc;
            else if (!strcmp(call, "uuid")) g->rc_uuid = rc;
            else if (!strcmp(call, "name")) g->rc_name = rc;
            else if (!strcmp(call, "mig")) g->rc_mig = rc;
            else goto bad;
        } else if (!strcmp(word, "lost")) {
            char lost[512];
            if (sscanf(line, "%*s %d %511s", &i, lost) != 2 || i < 0 || i >= MAX_GPUS) goto bad;
            snprintf(gpus[i].lost_path, sizeof gpus[i].lost_path, "%s", lost);
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "nvml stub: bad scenario line: %s\n", line);
        fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

/* The device behind a handle, after the checks every device call makes. */
static nvmlReturn_t check(nvmlDevice_t dev, struct gpu **g) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!dev || dev->gpu < 0 || dev->gpu >= gpu_count || !gpus[dev->gpu].node.present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = &gpus[dev->gpu];
    if ((*g)->lost_path[0] && access((*g)->lost_path, F_OK) == 0) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *buf, unsigned int length, const char *value) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    log_call("init");
    const char *path = getenv("NVML_STUB_SCENARIO");
    if (!path || parse(path) != 0) return NVML_ERROR_UNKNOWN;
    if (init_rc != NVML_SUCCESS) return init_rc;
    initialised++;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    log_call("shutdown");
    initialised--;
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, driver);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (count_rc != NVML_SUCCESS) return count_rc;
    *count = (unsigned int)gpu_count;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)gpu_count || !gpus[index].node.present)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gpu *g;
    nvmlReturn_t rc = check(&gpus[index].node, &g);
    if (rc != NVML_SUCCESS) return rc;
    *device = &gpus[index].node;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (dev->slot < 0 && g->rc_uuid) return g->rc_uuid;
    return copy_string(uuid, length, dev->uuid);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->rc_name) return g->rc_name;
    return copy_string(name, length, g->name);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->rc_mem) return g->rc_mem;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = dev->mem.total;
    memory->free = dev->mem.free;
    memory->used = dev->mem.used + dev->mem.reserved; /* v1: used includes reserved */
    return NVML_SUCCESS;
}

#ifndef NO_MEMORY_V2
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->rc_mem) return g->rc_mem;
    if (g->rc_mem_v2) return g->rc_mem_v2;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = dev->mem.total;
    memory->reserved = dev->mem.reserved;
    memory->free = dev->mem.free;
    memory->used = dev->mem.used;
    return NVML_SUCCESS;
}
#endif

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->rc_mig) return g->rc_mig;
    if (dev->slot >= 0 || g->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g->mig_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (dev->slot >= 0 || g->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index,
                                                     nvmlDevice_t *mig) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (dev->slot >= 0 || g->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode != 1 || !g->migs[index].present) return NVML_ERROR_NOT_FOUND;
    *mig = &g->migs[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (dev->slot < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = dev->gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (dev->slot < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = dev->ci;
    return NVML_SUCCESS;
}

/*
 * The three process lists. NVML fills *count with what is there and answers INSUFFICIENT_SIZE
 * when infos is NULL or too short, SUCCESS with *count 0 when the list is empty; pynvml asks
 * once with NULL, then with room for twice as many plus five.
 */
/* unused: the build without any process list (-DNO_PROCS_V3 -DNO_PROCS_V2) */
__attribute__((unused)) static nvmlReturn_t list_procs(nvmlDevice_t dev, int list,
                                                       unsigned int *count,
                                                       nvmlProcessInfo_t *infos) {
    struct gpu *g;
    nvmlReturn_t rc = check(dev, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->rc_procs[list]) return g->rc_procs[list];
    /* A MIG instance has no graphics contexts (NVIDIA's MIG user guide). */
    if (list == LIST_GRAPHICS && dev->slot >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    /* On a GPU in MIG mode the parent lists nothing here; each MIG device lists its own. */
    unsigned int n = 0;
    for (int k = 0; k < proc_count; k++)
        if (procs[k].gpu == dev->gpu && procs[k].slot == dev->slot && procs[k].list == list) n++;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int j = 0;
    for (int k = 0; k < proc_count; k++) {
        if (procs[k].gpu != dev->gpu || procs[k].slot != dev->slot || procs[k].list != list)
            continue;
        infos[j].pid = procs[k].pid;
        infos[j].usedGpuMemory = procs[k].used;
        infos[j].gpuInstanceId = dev->slot < 0 ? NA_UINT : dev->gi;
        infos[j].computeInstanceId = dev->slot < 0 ? NA_UINT : dev->ci;
        j++;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* _v2 and _v3 take the same nvmlProcessInfo_v2_t layout (nvml.h; pynvml declares one struct). */
#define PROCS(name, list)                                                                      \
    API nvmlReturn_t name(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {   \
        return list_procs(dev, list, count, infos);                                            \
    }

#ifndef NO_PROCS_V3
PROCS(nvmlDeviceGetComputeRunningProcesses_v3, LIST_COMPUTE)
PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3, LIST_GRAPHICS)
#ifndef NO_MPS
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, LIST_MPS)
#endif
#endif

#ifndef NO_PROCS_V2
PROCS(nvmlDeviceGetComputeRunningProcesses_v2, LIST_COMPUTE)
PROCS(nvmlDeviceGetGraphicsRunningProcesses_v2, LIST_GRAPHICS)
#ifndef NO_MPS
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v2, LIST_MPS)
#endif
#endif
