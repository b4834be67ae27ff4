/* suaveplan.h — host imports for guests run by suaveplan-sandbox's WASM host.
 *
 * Every function returns a WASI preview 1 errno (0 = success). ACCES (2): the manifest
 * does not grant the request (the host adapter was never called). FAULT (21): a pointer
 * or length lies outside guest memory. NOBUFS (42): the output buffer is too small;
 * *len_out holds the size needed. CANCELED (11): the sandbox is being disposed.
 * NOSYS (52): the host provides no adapter. IO (29): the adapter failed. INVAL (28):
 * malformed JSON. See docs/wasm-abi.md.
 */
#ifndef SUAVEPLAN_H
#define SUAVEPLAN_H

#include <stdint.h>

#define SUAVEPLAN_IMPORT(name) __attribute__((import_module("suaveplan"), import_name(name)))

enum {
    SUAVEPLAN_OK = 0,
    SUAVEPLAN_EACCES = 2,
    SUAVEPLAN_EBADF = 8,
    SUAVEPLAN_ECANCELED = 11,
    SUAVEPLAN_EFAULT = 21,
    SUAVEPLAN_EINVAL = 28,
    SUAVEPLAN_EIO = 29,
    SUAVEPLAN_EMFILE = 33,
    SUAVEPLAN_ENOBUFS = 42,
    SUAVEPLAN_ENOSYS = 52,
};

/* Outbound TCP to host:port (checked against permissions.fetch). *fd_out = handle.
   EMFILE when the sandbox already holds its most open sockets (close one first). */
SUAVEPLAN_IMPORT("sock_connect")
int32_t suaveplan_sock_connect(const char *host, uint32_t host_len, uint32_t port,
                               uint32_t *fd_out);
SUAVEPLAN_IMPORT("sock_send")
int32_t suaveplan_sock_send(uint32_t fd, const void *buf, uint32_t len, uint32_t *sent_out);
SUAVEPLAN_IMPORT("sock_recv")
int32_t suaveplan_sock_recv(uint32_t fd, void *buf, uint32_t cap, uint32_t *len_out);
SUAVEPLAN_IMPORT("sock_close")
int32_t suaveplan_sock_close(uint32_t fd);

/* The value of a secret declared in the manifest's secrets[]. */
SUAVEPLAN_IMPORT("secrets_get")
int32_t suaveplan_secrets_get(const char *name, uint32_t name_len, char *buf, uint32_t cap,
                              uint32_t *len_out);

/* Publish a JSON payload (empty = null) to a topic in events.publishes[]. */
SUAVEPLAN_IMPORT("events_publish")
int32_t suaveplan_events_publish(const char *topic, uint32_t topic_len, const char *payload_json,
                                 uint32_t payload_len);

/* Run SQL with JSON array params; writes {"columns":[...],"rows":[[...]],"rowcount":n}. */
SUAVEPLAN_IMPORT("db_query")
int32_t suaveplan_db_query(const char *sql, uint32_t sql_len, const char *params_json,
                           uint32_t params_len, char *out, uint32_t cap, uint32_t *len_out);

/* HTTP request as JSON {"url","method","headers":[[k,v]],"body_base64"}; writes
 * {"status":n,"headers":[[k,v]],"body_base64":"..."}. */
SUAVEPLAN_IMPORT("fetch")
int32_t suaveplan_fetch(const char *req_json, uint32_t req_len, char *out, uint32_t cap,
                        uint32_t *len_out);

#endif
