/* fsync a file on a native thread and report to a socket the event loop watches.
 *
 * Why native: a Python thread that returns from fsync must take the GIL back before it can tell
 * the event loop, and while the loop is busy parsing requests CPython hands the GIL over only
 * every switch interval (5 ms). That wait, not the fsync (0.2 ms on a local disk), was most of
 * an ingest group commit. This thread never touches the interpreter: it opens, fsyncs, closes
 * and writes one fixed-size record to its own duplicate of the report socket; the loop reads
 * the record when it next looks at its file descriptors (app/ingest/commit/loop_fsync.py).
 *
 * start(path, fallback, report_fd, tag): returns at once; the record is, in native byte order,
 *   uint64 tag, int32 errno (0: synced), int32 which (0: path, 1: fallback).
 * fallback (bytes or None) is synced instead when path does not exist (ENOENT).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    char *path;
    char *fallback; /* NULL: none */
    int report_fd;  /* a dup owned by the thread */
    uint64_t tag;
} job_t;

typedef struct {
    uint64_t tag;
    int32_t err;
    int32_t which;
} record_t;

static int sync_one(const char *path) {
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return errno;
    }
    int err = 0;
    if (fsync(fd) != 0) {
        err = errno;
    }
    close(fd);
    return err;
}

static void *run(void *arg) {
    job_t *job = (job_t *)arg;
    record_t rec = {.tag = job->tag, .err = 0, .which = 0};
    rec.err = sync_one(job->path);
    if (rec.err == ENOENT && job->fallback != NULL) {
        rec.which = 1;
        rec.err = sync_one(job->fallback);
    }
    /* 16 bytes on a Unix stream socket: sent whole or not at all (a closed reader: EPIPE,
       without a signal). */
    ssize_t sent;
    do {
        sent = send(job->report_fd, &rec, sizeof rec, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    close(job->report_fd);
    free(job->path);
    free(job->fallback);
    free(job);
    return NULL;
}

static char *copy_path(PyObject *bytes_obj) {
    char *s = strdup(PyBytes_AS_STRING(bytes_obj));
    if (s == NULL) {
        PyErr_NoMemory();
    }
    return s;
}

static PyObject *start(PyObject *self, PyObject *args) {
    PyObject *path_obj = NULL, *fallback_obj = NULL;
    int report_fd;
    unsigned long long tag;
    if (!PyArg_ParseTuple(args, "O&OiK", PyUnicode_FSConverter, &path_obj, &fallback_obj,
                          &report_fd, &tag)) {
        return NULL;
    }
    PyObject *fallback_bytes = NULL;
    if (fallback_obj != Py_None && !PyUnicode_FSConverter(fallback_obj, &fallback_bytes)) {
        Py_DECREF(path_obj);
        return NULL;
    }
    job_t *job = calloc(1, sizeof *job);
    if (job == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    job->tag = (uint64_t)tag;
    job->report_fd = -1;
    if ((job->path = copy_path(path_obj)) == NULL) {
        goto fail;
    }
    if (fallback_bytes != NULL && (job->fallback = copy_path(fallback_bytes)) == NULL) {
        goto fail;
    }
    /* The thread's own descriptor: the caller may close its socket (and the number be reused)
       while the fsync is still running. */
    job->report_fd = fcntl(report_fd, F_DUPFD_CLOEXEC, 0);
    if (job->report_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, run, job);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    Py_DECREF(path_obj);
    Py_XDECREF(fallback_bytes);
    Py_RETURN_NONE;

fail:
    if (job != NULL) {
        if (job->report_fd >= 0) {
            close(job->report_fd);
        }
        free(job->path);
        free(job->fallback);
        free(job);
    }
    Py_DECREF(path_obj);
    Py_XDECREF(fallback_bytes);
    return NULL;
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS,
     "start(path, fallback, report_fd, tag): fsync path (or fallback when path does not exist) "
     "on a native thread, then send (tag, errno, which) to report_fd."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fsyncd", "fsync on a native thread (see app/ingest/commit/loop_fsync.py)",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fsyncd(void) { return PyModule_Create(&module); }
