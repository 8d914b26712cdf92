/*
 * A stand-in for Iluvatar's libixml.so: the NVML-compatible calls the plugin
 * uses, answered from a text file named by the IXML_DOUBLE_CONFIG environment
 * variable. The file is re-read by nvmlInit, nvmlDeviceGetCount and
 * ixmlDeviceGetHealth, so a test can change devices while a backend runs.
 *
 * Config format, one item per line, '#' starts a comment:
 *   driver=4.1.0                 driver version string
 *   cuda=10020                   nvmlSystemGetCudaDriverVersion (absent: NOT_SUPPORTED)
 *   fail_init=1                  nvmlInit answers DRIVER_NOT_LOADED (9)
 *   fail_count=1                 nvmlDeviceGetCount answers UNKNOWN (999)
 *   link=0,1,10                  common-ancestor level of devices 0 and 1
 *                                (pairs not listed answer 50, SYSTEM)
 *   xid=1,79                     a critical XID event (79) on device 1: each xid line is delivered once,
 *                                in file order, by nvmlEventSetWait_v2 (append lines to inject more)
 *   hang_wait=1                  nvmlEventSetWait_v2 never returns (it sleeps an hour)
 *   device key=value ...         one device, in index order; keys:
 *     uuid=GPU-...  name="Iluvatar BI-V150"  minor=0  bus=00000000:8A:00.0
 *     memory=32768 (MiB)  board=B0  position=0  health=0x14
 *     fail=LIST         these calls answer UNKNOWN (999)
 *     unsupported=LIST  these calls answer NOT_SUPPORTED (3)
 *     hang=LIST         these calls never return (they sleep an hour), as a wedged driver's do
 *     telemetry: temp=C fan=% power=mW board_power=mW sm_clock=MHz mem_clock=MHz gpu_util=%
 *       mem_util=% mem_used=MiB pcie_tx=KB/s pcie_rx=KB/s ecc_sbe=N ecc_dbe=N
 *   where LIST is a comma-separated subset of: handle, uuid, name, minor, pci, memory,
 *   board (ixmlDeviceGetBoardPosition), same_board (nvmlDeviceOnSameBoard), health, topology,
 *   temperature, fan, power, board_power, clock, utilization, pcie, ecc,
 *   events (nvmlDeviceRegisterEvents)
 *
 * Build variants with -D:
 *   NO_VERSIONED_NAMES   export only nvmlInit, nvmlDeviceGetCount, ... (old driver)
 *   NO_IXML_EXTENSIONS   leave out ixmlDeviceGetBoardPosition and ixmlDeviceGetHealth
 *   NO_TOPOLOGY          leave out nvmlDeviceGetTopologyCommonAncestor
 *   NO_TELEMETRY         leave out the temperature, fan, power, clock, utilization, PCIe and ECC calls
 *   NO_EVENTS            leave out nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree
 *   LIBUPNP_LIKE         export only XML-parser symbols, like libupnp's libixml.so
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef LIBUPNP_LIKE

typedef struct { int unused; } IXML_Document;

int ixmlParseBufferEx(const char *buffer, IXML_Document **doc) {
    (void)buffer;
    *doc = NULL;
    return 0;
}

void ixmlDocument_free(IXML_Document *doc) { (void)doc; }

#else

#define MAX_DEVICES 64
#define MAX_LINKS 256

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

typedef int nvmlReturn_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

struct device {
    char uuid[96];
    char name[96];
    unsigned int minor;
    char bus[32];
    unsigned long long memory_mib;
    char board[64];
    unsigned int position;
    unsigned long long health;
    char fail[256];
    char unsupported[256];
    char hang[256];
    unsigned int temp, fan, power, board_power, sm_clock, mem_clock, gpu_util, mem_util, pcie_tx, pcie_rx;
    unsigned long long mem_used, ecc_sbe, ecc_dbe;
};

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

struct link {
    unsigned int a, b;
    int level;
};

/* A handle points at one of these; its index is checked against the current device count. */
struct slot {
    unsigned int index;
};

static struct device devices[MAX_DEVICES];
static unsigned int device_count;
static struct link links[MAX_LINKS];
static unsigned int link_count;
static struct slot slots[MAX_DEVICES];
static char driver_version[80] = "0.0.0";
static int cuda_version = 0; /* 0: nvmlSystemGetCudaDriverVersion answers NOT_SUPPORTED */
static int fail_init;
static int fail_count;
static int init_count;

static int listed(const char *list, const char *item) {
    size_t len = strlen(item);
    const char *p = list;
    while ((p = strstr(p, item)) != NULL) {
        int starts = (p == list || p[-1] == ',');
        int ends = (p[len] == '\0' || p[len] == ',');
        if (starts && ends) return 1;
        p += len;
    }
    return 0;
}

static void copy_value(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

/* Splits "key=value" tokens, where value may be double-quoted to hold spaces. */
static char *next_token(char **cursor, char **value) {
    char *p = *cursor;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0') return NULL;
    char *key = p;
    while (*p && *p != '=' && *p != ' ' && *p != '\t') p++;
    *value = p;
    if (*p == '=') {
        *p++ = '\0';
        if (*p == '"') {
            *value = ++p;
            while (*p && *p != '"') p++;
        } else {
            *value = p;
            while (*p && *p != ' ' && *p != '\t') p++;
        }
    }
    if (*p) *p++ = '\0';
    *cursor = p;
    return key;
}

static void parse_device(char *rest) {
    if (device_count >= MAX_DEVICES) return;
    struct device *d = &devices[device_count++];
    memset(d, 0, sizeof(*d));
    snprintf(d->uuid, sizeof(d->uuid), "GPU-double-%u", device_count - 1);
    copy_value(d->name, sizeof(d->name), "Iluvatar BI-V100");
    d->minor = device_count - 1;
    snprintf(d->bus, sizeof(d->bus), "00000000:%02X:00.0", device_count);
    d->memory_mib = 32768;
    snprintf(d->board, sizeof(d->board), "board-%u", device_count - 1);
    char *value;
    char *key;
    while ((key = next_token(&rest, &value)) != NULL) {
        if (strcmp(key, "uuid") == 0) copy_value(d->uuid, sizeof(d->uuid), value);
        else if (strcmp(key, "name") == 0) copy_value(d->name, sizeof(d->name), value);
        else if (strcmp(key, "minor") == 0) d->minor = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "bus") == 0) copy_value(d->bus, sizeof(d->bus), value);
        else if (strcmp(key, "memory") == 0) d->memory_mib = strtoull(value, NULL, 0);
        else if (strcmp(key, "board") == 0) copy_value(d->board, sizeof(d->board), value);
        else if (strcmp(key, "position") == 0) d->position = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "health") == 0) d->health = strtoull(value, NULL, 0);
        else if (strcmp(key, "fail") == 0) copy_value(d->fail, sizeof(d->fail), value);
        else if (strcmp(key, "unsupported") == 0) copy_value(d->unsupported, sizeof(d->unsupported), value);
        else if (strcmp(key, "hang") == 0) copy_value(d->hang, sizeof(d->hang), value);
        else if (strcmp(key, "temp") == 0) d->temp = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "fan") == 0) d->fan = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "power") == 0) d->power = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "board_power") == 0) d->board_power = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "sm_clock") == 0) d->sm_clock = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "mem_clock") == 0) d->mem_clock = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "gpu_util") == 0) d->gpu_util = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "mem_util") == 0) d->mem_util = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "mem_used") == 0) d->mem_used = strtoull(value, NULL, 0);
        else if (strcmp(key, "pcie_tx") == 0) d->pcie_tx = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "pcie_rx") == 0) d->pcie_rx = (unsigned int)strtoul(value, NULL, 0);
        else if (strcmp(key, "ecc_sbe") == 0) d->ecc_sbe = strtoull(value, NULL, 0);
        else if (strcmp(key, "ecc_dbe") == 0) d->ecc_dbe = strtoull(value, NULL, 0);
    }
}

static void load_config(void) {
    device_count = 0;
    link_count = 0;
    fail_init = 0;
    fail_count = 0;
    copy_value(driver_version, sizeof(driver_version), "0.0.0");
    cuda_version = 0;
    const char *path = getenv("IXML_DOUBLE_CONFIG");
    if (path == NULL) return;
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\r\n#")] = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "device", 6) == 0 && (p[6] == ' ' || p[6] == '\t' || p[6] == '\0')) {
            parse_device(p + 6);
        } else if (strncmp(p, "driver=", 7) == 0) {
            copy_value(driver_version, sizeof(driver_version), p + 7);
        } else if (strncmp(p, "cuda=", 5) == 0) {
            cuda_version = atoi(p + 5);
        } else if (strncmp(p, "fail_init=", 10) == 0) {
            fail_init = atoi(p + 10);
        } else if (strncmp(p, "fail_count=", 11) == 0) {
            fail_count = atoi(p + 11);
        } else if (strncmp(p, "link=", 5) == 0 && link_count < MAX_LINKS) {
            struct link *l = &links[link_count];
            if (sscanf(p + 5, "%u,%u,%d", &l->a, &l->b, &l->level) == 3) link_count++;
        }
    }
    fclose(f);
}

/* Resolves a handle to its device, or answers why not. */
static nvmlReturn_t lookup(void *handle, struct device **out) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (handle == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct slot *s = (struct slot *)handle;
    if (s->index >= device_count) return NVML_ERROR_GPU_IS_LOST;
    *out = &devices[s->index];
    return NVML_SUCCESS;
}

static nvmlReturn_t injected(const struct device *d, const char *call) {
    if (listed(d->hang, call)) sleep(3600);
    if (listed(d->fail, call)) return NVML_ERROR_UNKNOWN;
    if (listed(d->unsupported, call)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *dst, unsigned int size, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t ret) {
    switch (ret) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t do_init(void) {
    load_config();
    if (fail_init) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned int i = 0; i < MAX_DEVICES; i++) slots[i].index = i;
    init_count++;
    return NVML_SUCCESS;
}

static volatile int waiting; /* nvmlEventSetWait_v2 calls in progress */
static volatile int shutdown_while_waiting;

/* 1 once nvmlShutdown ran while a thread was inside nvmlEventSetWait_v2 (a use-after-free on real drivers). */
int ixml_double_shutdown_while_waiting(void) { return shutdown_while_waiting; }

/* How many threads are inside nvmlEventSetWait_v2 now. */
int ixml_double_waiting(void) { return waiting; }

nvmlReturn_t nvmlShutdown(void) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (waiting) shutdown_while_waiting = 1;
    init_count--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, driver_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (cuda_version == 0) return NVML_ERROR_NOT_SUPPORTED;
    *version = cuda_version;
    return NVML_SUCCESS;
}

static nvmlReturn_t do_get_count(unsigned int *count) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    load_config();
    if (fail_count) return NVML_ERROR_UNKNOWN;
    *count = device_count;
    return NVML_SUCCESS;
}

static nvmlReturn_t do_get_handle(unsigned int index, void **handle) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (listed(devices[index].fail, "handle")) return NVML_ERROR_UNKNOWN;
    *handle = &slots[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t do_get_pci_info(void *handle, nvmlPciInfo_t *pci) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "pci");
    if (ret != NVML_SUCCESS) return ret;
    memset(pci, 0, sizeof(*pci));
    sscanf(d->bus, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    copy_value(pci->busId, sizeof(pci->busId), d->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0",
             pci->domain & 0xffff, pci->bus & 0xff, pci->device & 0xff);
    pci->pciDeviceId = 0x00011e3e;
    return NVML_SUCCESS;
}

#ifdef NO_VERSIONED_NAMES
nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return do_get_count(count); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **handle) {
    return do_get_handle(index, handle);
}
/* The oldest struct carries only the 16-byte bus id, then the numeric fields. */
nvmlReturn_t nvmlDeviceGetPciInfo(void *handle, nvmlPciInfo_t *pci) {
    nvmlReturn_t ret = do_get_pci_info(handle, pci);
    if (ret == NVML_SUCCESS) memset(pci->busId, 0, sizeof(pci->busId));
    return ret;
}
#else
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return do_get_count(count); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    return do_get_handle(index, handle);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *handle, nvmlPciInfo_t *pci) {
    return do_get_pci_info(handle, pci);
}
#endif

nvmlReturn_t nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "uuid");
    if (ret != NVML_SUCCESS) return ret;
    return copy_string(uuid, length, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "name");
    if (ret != NVML_SUCCESS) return ret;
    return copy_string(name, length, d->name);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(void *handle, unsigned int *minor) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "minor");
    if (ret != NVML_SUCCESS) return ret;
    *minor = d->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "memory");
    if (ret != NVML_SUCCESS) return ret;
    memory->total = d->memory_mib * 1024ULL * 1024ULL;
    memory->used = d->mem_used * 1024ULL * 1024ULL;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceOnSameBoard(void *handle1, void *handle2, int *on_same_board) {
    struct device *a;
    struct device *b;
    nvmlReturn_t ret = lookup(handle1, &a);
    if (ret == NVML_SUCCESS) ret = lookup(handle2, &b);
    if (ret == NVML_SUCCESS) ret = injected(a, "same_board");
    if (ret == NVML_SUCCESS) ret = injected(b, "same_board");
    if (ret != NVML_SUCCESS) return ret;
    *on_same_board = strcmp(a->board, b->board) == 0;
    return NVML_SUCCESS;
}

#ifndef NO_TOPOLOGY
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *handle1, void *handle2, int *level) {
    struct device *a;
    struct device *b;
    nvmlReturn_t ret = lookup(handle1, &a);
    if (ret == NVML_SUCCESS) ret = lookup(handle2, &b);
    if (ret == NVML_SUCCESS) ret = injected(a, "topology");
    if (ret == NVML_SUCCESS) ret = injected(b, "topology");
    if (ret != NVML_SUCCESS) return ret;
    unsigned int ia = ((struct slot *)handle1)->index;
    unsigned int ib = ((struct slot *)handle2)->index;
    *level = ia == ib ? 0 : 50;
    for (unsigned int i = 0; i < link_count; i++) {
        if ((links[i].a == ia && links[i].b == ib) || (links[i].a == ib && links[i].b == ia)) {
            *level = links[i].level;
        }
    }
    return NVML_SUCCESS;
}
#endif

#ifndef NO_IXML_EXTENSIONS
nvmlReturn_t ixmlDeviceGetBoardPosition(void *handle, unsigned int *position) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "board");
    if (ret != NVML_SUCCESS) return ret;
    *position = d->position;
    return NVML_SUCCESS;
}

nvmlReturn_t ixmlDeviceGetHealth(void *handle, unsigned long long *health) {
    struct device *d;
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    load_config();
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "health");
    if (ret != NVML_SUCCESS) return ret;
    *health = d->health;
    return NVML_SUCCESS;
}
#endif

#ifndef NO_TELEMETRY
/* Telemetry: each answers the device's configured value, or what fail/unsupported/hang say. */
#define ANSWER(call, expr) \
    struct device *d; \
    nvmlReturn_t ret = lookup(handle, &d); \
    if (ret == NVML_SUCCESS) ret = injected(d, call); \
    if (ret != NVML_SUCCESS) return ret; \
    expr; \
    return NVML_SUCCESS;

nvmlReturn_t nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *temp) {
    (void)sensor;
    ANSWER("temperature", *temp = d->temp)
}
nvmlReturn_t nvmlDeviceGetFanSpeed(void *handle, unsigned int *speed) { ANSWER("fan", *speed = d->fan) }
nvmlReturn_t nvmlDeviceGetPowerUsage(void *handle, unsigned int *power) { ANSWER("power", *power = d->power) }
nvmlReturn_t nvmlDeviceGetClockInfo(void *handle, int type, unsigned int *mhz) {
    ANSWER("clock", *mhz = (type == 2 ? d->mem_clock : d->sm_clock))
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *rates) {
    ANSWER("utilization", rates->gpu = d->gpu_util; rates->memory = d->mem_util)
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *handle, int counter, unsigned int *kbps) {
    ANSWER("pcie", *kbps = (counter == 0 ? d->pcie_tx : d->pcie_rx))
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *handle, int error_type, int counter_type, unsigned long long *count) {
    (void)counter_type;
    ANSWER("ecc", *count = (error_type == 0 ? d->ecc_sbe : d->ecc_dbe))
}
#ifndef NO_IXML_EXTENSIONS
nvmlReturn_t ixmlDeviceGetBoardPowerUsage(void *handle, unsigned int *power) {
    ANSWER("board_power", *power = d->board_power)
}
#endif
#endif /* NO_TELEMETRY */

#ifndef NO_EVENTS
#define XID_CRITICAL_ERROR 0x8ULL

typedef struct {
    void *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct event_set {
    unsigned long long registered[MAX_DEVICES]; /* event types registered, by device index */
};

static unsigned int xids_delivered; /* xid lines of the config file already delivered */
static char xids_path[4096];         /* ... of this file (another file starts again) */

nvmlReturn_t nvmlEventSetCreate(struct event_set **set) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(struct event_set));
    return *set == NULL ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *handle, unsigned long long types, struct event_set *set) {
    struct device *d;
    nvmlReturn_t ret = lookup(handle, &d);
    if (ret == NVML_SUCCESS) ret = injected(d, "events");
    if (ret != NVML_SUCCESS) return ret;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered[((struct slot *)handle)->index] |= types;
    return NVML_SUCCESS;
}

/* The next undelivered xid line of the config file, read without touching the device table
 * (other threads use it meanwhile); 1 when there is one. */
static int next_xid(unsigned int *index, unsigned long long *xid) {
    const char *path = getenv("IXML_DOUBLE_CONFIG");
    FILE *f = path == NULL ? NULL : fopen(path, "r");
    if (f == NULL) return 0;
    if (strcmp(path, xids_path) != 0) {
        copy_value(xids_path, sizeof(xids_path), path);
        xids_delivered = 0;
    }
    char line[1024];
    unsigned int seen = 0;
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "xid=", 4) != 0 || sscanf(p + 4, "%u,%llu", index, xid) != 2) continue;
        if (seen++ == xids_delivered) found = 1;
    }
    fclose(f);
    return found;
}

/* 1 when the config file has a hang_wait=1 line. */
static int wait_hangs(void) {
    const char *path = getenv("IXML_DOUBLE_CONFIG");
    FILE *f = path == NULL ? NULL : fopen(path, "r");
    if (f == NULL) return 0;
    char line[1024];
    int hangs = 0;
    while (!hangs && fgets(line, sizeof(line), f) != NULL) hangs = strncmp(line, "hang_wait=1", 11) == 0;
    fclose(f);
    return hangs;
}

nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    waiting++;
    if (wait_hangs()) sleep(3600);
    nvmlReturn_t ret = NVML_ERROR_TIMEOUT;
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 10) {
        unsigned int index;
        unsigned long long xid;
        if (next_xid(&index, &xid)) {
            xids_delivered++;
            if (index < MAX_DEVICES && (set->registered[index] & XID_CRITICAL_ERROR)) {
                memset(data, 0, sizeof(*data));
                data->device = &slots[index];
                data->eventType = XID_CRITICAL_ERROR;
                data->eventData = xid;
                ret = NVML_SUCCESS;
                break;
            }
            continue; /* an event for a device this set does not watch */
        }
        if (waited >= timeoutms) break;
        nanosleep(&tick, NULL);
    }
    waiting--;
    return ret;
}

nvmlReturn_t nvmlEventSetFree(struct event_set *set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
#endif /* NO_EVENTS */

#endif /* LIBUPNP_LIKE */
