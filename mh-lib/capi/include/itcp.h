/*
 * itcp.h: the I-TCP mobile-host library for C (libitcp.so, libitcp.a).
 *
 * GENERATED from mh-lib/capi/src (the Rust definitions and their doc comments) by the
 * unit test `header_is_current` of the crate itcp-mh-c. Do not edit: change the Rust
 * side and run `ITCP_BLESS=1 cargo test -p itcp-mh-c`.
 *
 * An application on a mobile host (MH) opens its TCP connections through its current
 * mobility support router (MSR), which splits each into a wireless and a fixed half
 * (Bakre & Badrinath, I-TCP). The functions below are the paper's calls: they return
 * ordinary connected socket file descriptors that read, write, poll and close like any
 * TCP socket; the bytes reach the peer through the MSR.
 *
 * Configuration, read at each call (see mh-lib/src/options.rs):
 *   ITCP_MH_CONFIG  an MH config file (mh.toml); else
 *   ITCP_GATEWAY    the gateway (addr:port, addr -> port 1080), else the default route's
 *                   gateway at port 1080;
 *   ITCP_TOKEN      the session token (32 hex digits), else ITCP_TOKEN_FILE, else
 *                   /run/itcp-mh/token (created if absent).
 *
 * Errors: functions returning int return -1 and set errno (see each function); the
 * thread's last error message is itcp_last_error(). Failures reported by the MSR map
 * as: refused ECONNREFUSED, network unreachable ENETUNREACH, host unreachable
 * EHOSTUNREACH, timed out ETIMEDOUT, not allowed EACCES, address in use EADDRINUSE,
 * no such listener ENOENT, not supported EOPNOTSUPP, general failure EIO; a malformed
 * answer EPROTO; no gateway configured ENOENT; a bad argument EINVAL.
 *
 * Thread safety: every function may be called from any thread, concurrently. Blocking
 * calls (itcp_connect, itcp_listen, itcp_accept) block only the calling thread.
 *
 * Link with -litcp (shared; add -Wl,-rpath,DIR or set LD_LIBRARY_PATH), or libitcp.a
 * plus -lpthread -ldl -lm.
 */
#ifndef ITCP_H
#define ITCP_H

#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Event: the agent attached to an MSR with nothing to move (first contact, or an
 * MSR after connections were lost). to_msr names it.
 */
#define ITCP_EVENT_ATTACHED 1

/*
 * Event: the MH's connections moved from_msr -> to_msr (a handoff completed);
 * connections is how many, elapsed_ms the time since the greeting.
 */
#define ITCP_EVENT_MOVED 2

/* Event: a handoff failed; the connections stayed with from_msr (reason says why). */
#define ITCP_EVENT_MOVE_FAILED 3

/* Event: the MSR to_msr refused the MH's greeting (reason says why). */
#define ITCP_EVENT_REFUSED 4

/*
 * Event: no MSR is heard any more (the beacons of from_msr expired and no other MSR
 * is in range). Open connections stay open at the MSR, waiting for the MH.
 */
#define ITCP_EVENT_DISCONNECTED 5

/*
 * Event: the first contact after ITCP_EVENT_DISCONNECTED: the MH hears its MSR again
 * (from_msr = to_msr) or reached another one, whose ATTACHED or MOVED event came
 * just before this one.
 */
#define ITCP_EVENT_RECONNECTED 6

/*
 * Event: the agent stopped on an error (reason says which); no more events follow
 * until itcp_agent_start is called again (after itcp_agent_stop).
 */
#define ITCP_EVENT_AGENT_ERROR 7

/* A mobility event, passed to the callback set with itcp_set_event_callback. */
struct itcp_event {
    /* One of ITCP_EVENT_*. */
    int kind;
    /* The MSR the MH comes from ("" if none). Never NULL. */
    const char *from_msr;
    /* The MSR the MH is at now ("" if none). Never NULL. */
    const char *to_msr;
    /* MOVED/ATTACHED: connections moved (or held) by the MSR; else 0. */
    uint32_t connections;
    /* MOVED: ms from the greeting to the end of the handoff; else 0. */
    double elapsed_ms;
    /* MOVE_FAILED, REFUSED, AGENT_ERROR: why; else "". Never NULL. */
    const char *reason;
};

/*
 * The event callback: see itcp_set_event_callback. event and its strings are
 * valid only during the call.
 */
typedef void (*itcp_event_cb)(const struct itcp_event *event, void *user);

/*
 * Opens an I-TCP connection to host:port through the current MSR (the paper's
 * active open). host is an IPv4/IPv6 address in text form, or a name, which the MSR
 * resolves (as SOCKS5 does), not this host. Blocks until the MSR has connected to
 * the peer or failed.
 *
 * Returns a connected, blocking TCP socket (FD_CLOEXEC set) whose bytes reach the
 * peer through the MSR. The caller owns it: close it with close(2) or itcp_close.
 * getpeername(2) on it names the gateway, not the peer.
 *
 * On failure returns -1 and sets errno: EINVAL (host NULL, not UTF-8, or too
 * long), ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, ETIMEDOUT (the MSR's answer for
 * the peer, or no answer from the gateway within the connect timeout), EACCES (the
 * MSR does not serve this MH, or rejected the session token), ENOENT (no gateway
 * configured), EPROTO (the gateway is not an I-TCP MSR), ECONNABORTED (the gateway
 * closed the connection), or the errno of reaching the gateway.
 *
 * # Safety
 * host is NULL or a NUL-terminated string.
 */
int itcp_connect(const char *host, uint16_t port);

/*
 * Asks the MSR to listen for this MH on the MH's address, port port (0: the MSR
 * picks one; see itcp_listener_addr). This is the paper's passive open: peers
 * connect to the MH's address, the MSR accepts for it.
 *
 * Returns a listener handle: the fd of the control connection to the MSR that keeps
 * the listener open. Use it only with itcp_accept, itcp_listener_addr and
 * itcp_close; do not read or write it. It becomes readable (EOF) if the MSR drops
 * the listener. Close it with itcp_close (close(2) closes the listener at the MSR
 * too, but leaves a small record here until the fd number is reused).
 *
 * On failure returns -1 and sets errno: EADDRINUSE (port taken), EACCES (the MSR
 * does not serve this MH, or the listener belongs to another MH), and the gateway
 * errors of itcp_connect.
 */
int itcp_listen(uint16_t port);

/*
 * Stores the address the MSR listens on for the listener listen_fd (the MH's
 * address and the port) like getsockname(2): at most *len bytes into addr, then the
 * full size into *len.
 *
 * Returns 0, or -1 with errno EBADF (listen_fd is not open) or EINVAL (listen_fd is
 * not a listener handle of itcp_listen, or addr or len is NULL).
 *
 * # Safety
 * addr points to *len writable bytes; len is valid.
 */
int itcp_listener_addr(int listen_fd, struct sockaddr_storage *addr, socklen_t *len);

/*
 * Waits for the next connection to the listener listen_fd (the paper's accept) and
 * returns it: a connected, blocking TCP socket (FD_CLOEXEC set), owned by the
 * caller, whose bytes reach the peer through the MSR. Blocks until a peer connects,
 * without a timeout. Several threads may wait on one listener at once; each
 * connection goes to one of them.
 *
 * If peer and len are not NULL, the peer's address is stored as accept(2) does: at
 * most *len bytes into peer, then the full size into *len.
 *
 * On failure returns -1 and sets errno: EBADF (listen_fd is not open), EINVAL
 * (listen_fd is not a listener handle of itcp_listen), ENOENT (the listener was
 * closed, e.g. by itcp_close from another thread), EACCES, and the gateway errors of
 * itcp_connect.
 *
 * # Safety
 * peer is NULL or points to *len writable bytes; len is NULL or valid.
 */
int itcp_accept(int listen_fd, struct sockaddr_storage *peer, socklen_t *len);

/*
 * Closes fd. For a listener handle of itcp_listen, closes the listener at the MSR
 * at once (a thread blocked in itcp_accept on it returns -1 with ENOENT) and frees
 * it. Any other fd is closed with close(2).
 *
 * Returns 0, or -1 with the errno of close(2) (EBADF if fd is not open).
 */
int itcp_close(int fd);

/*
 * The message of the last failed itcp_* call on this thread (e.g. "I-TCP gateway
 * 10.2.0.1:1080 could not connect to 10.0.0.1:9: connection refused"), or "".
 * The string stays valid until the next failing itcp_* call on this thread. Never
 * NULL.
 */
const char *itcp_last_error(void);

/*
 * Sets the mobility event callback (NULL: none), replacing the previous one.
 * cb(event, user) is called on the agent's thread (see itcp_agent_start), once per
 * event, in order; it should return quickly. It may call any itcp_* function except
 * itcp_agent_stop. event and its strings are valid only during the call. A callback
 * being replaced may still run once, concurrently, if an event is being delivered.
 *
 * Events come only from the agent: without itcp_agent_start nothing is reported.
 * The library does not watch the fds it returned (a reset or closed connection is
 * seen by the application's own reads and writes as usual).
 *
 * # Safety
 * cb, if not NULL, must be callable from another thread with user until it is
 * replaced and no call is in progress.
 */
void itcp_set_event_callback(itcp_event_cb cb, void *user);

/*
 * Starts the MH's mobility agent on a thread of this process (as the itcp-mh-agent
 * program does): it listens to MSR beacons on interface, greets a new MSR when the
 * MH moves (proving the session token), points the gateway address at the MSR that
 * holds the MH's connections (ip neigh replace), and reports each step as an event
 * to the callback of itcp_set_event_callback. Needs CAP_NET_ADMIN (root) and the
 * ip program. Run one agent per MH: a second process's agent cannot bind the beacon
 * port.
 *
 * interface is the wireless interface (e.g. "air0"), mh_addr the MH's address.
 * options is NULL or "key=value" items separated by commas or spaces: policy=eager
 * or lazy, hysteresis_ms, beacon_interval_ms, greet_retry_ms, greet_timeout_ms,
 * solicit=1 or 0 (ask for a beacon when the interface's carrier comes up instead of
 * waiting for the next one; default 1), beacon_port (4345), greet_port (4346). The
 * gateway and token come from the configuration, as for itcp_connect.
 *
 * Returns 0, or -1 with errno: EALREADY (an agent runs in this process), EINVAL (a
 * bad argument or option), EADDRINUSE (the beacon port is taken), EACCES (not
 * permitted), EIO (the interface cannot be used, e.g. there is none of that name),
 * ENOENT (no gateway configured).
 *
 * # Safety
 * interface and mh_addr are NULL or NUL-terminated strings; so is options.
 */
int itcp_agent_start(const char *interface, const char *mh_addr, const char *options);

/*
 * Stops the agent of itcp_agent_start and waits for its thread to end (within
 * about 50 ms). No event is delivered after it returns.
 *
 * Returns 0, or -1 with errno ESRCH (no agent was started) or EDEADLK (called from
 * the event callback, i.e. on the agent's own thread).
 */
int itcp_agent_stop(void);

/* The library's version, e.g. "0.1.0". Never NULL; static. */
const char *itcp_version(void);

#ifdef __cplusplus
}
#endif

#endif /* ITCP_H */
