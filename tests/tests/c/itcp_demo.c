/*
 * itcp_demo: a C program using libitcp (itcp.h) the way an application would, driven by
 * tests/tests/capi.rs inside the lab's MH namespace. Progress lines go to stdout (and,
 * for `mobile`, to the file named on the command line, flushed line by line, so the
 * test can follow them while the program runs).
 *
 *   itcp_demo connect HOST PORT NBYTES    send NBYTES (pattern i*7 mod 251), half-close,
 *                                         print what the peer answers
 *   itcp_demo refused HOST PORT           expect itcp_connect to fail; print errno
 *   itcp_demo listen PORT                 accept one connection, read to EOF, answer
 *                                         "got N bytes from PEER"
 *   itcp_demo listen-close PORT           a thread blocks in itcp_accept; itcp_close of
 *                                         the listener from main must end it with ENOENT
 *   itcp_demo mobile LOG HOST PORT NBYTES run the mobility agent with an event
 *                                         callback; send half, wait for MOVED, send the
 *                                         rest; wait for DISCONNECTED and RECONNECTED
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "itcp.h"

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_pattern(int fd, long from, long to) {
    unsigned char buf[8192];
    long i = from;
    while (i < to) {
        size_t n = 0;
        while (n < sizeof buf && i < to) buf[n++] = (unsigned char)((i++ * 7) % 251);
        if (write_all(fd, buf, n) != 0) return -1;
    }
    return 0;
}

static void read_answer(int fd) {
    char ans[512];
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, ans + got, sizeof ans - 1 - got)) > 0) got += (size_t)r;
    ans[got] = 0;
    printf("answer %s\n", ans);
}

static const char *errno_name(int e) {
    switch (e) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EACCES: return "EACCES";
    case EADDRINUSE: return "EADDRINUSE";
    case EINVAL: return "EINVAL";
    case ENOENT: return "ENOENT";
    default: return "other";
    }
}

static void fmt_addr(const struct sockaddr_storage *ss, char *out, size_t n) {
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
    }
    snprintf(out, n, "%s:%u", ip, port);
}

static int do_connect(const char *host, int port, long nbytes) {
    int fd = itcp_connect(host, (uint16_t)port);
    if (fd < 0) {
        printf("error %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    printf("connected fd %d\n", fd);
    if (send_pattern(fd, 0, nbytes) != 0) {
        perror("write");
        return 1;
    }
    shutdown(fd, SHUT_WR);
    read_answer(fd);
    return itcp_close(fd) == 0 ? 0 : 1;
}

static int do_refused(const char *host, int port) {
    int fd = itcp_connect(host, (uint16_t)port);
    if (fd >= 0) {
        printf("unexpectedly connected\n");
        return 1;
    }
    printf("errno %s\nmessage %s\n", errno_name(errno), itcp_last_error());
    return 0;
}

static int do_listen(int port) {
    int l = itcp_listen((uint16_t)port);
    if (l < 0) {
        printf("error %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char a[80];
    if (itcp_listener_addr(l, &ss, &len) != 0) return 1;
    fmt_addr(&ss, a, sizeof a);
    printf("listening %s\n", a);
    fflush(stdout);
    len = sizeof ss;
    int c = itcp_accept(l, &ss, &len);
    if (c < 0) {
        printf("error %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    fmt_addr(&ss, a, sizeof a);
    printf("accepted %s\n", a);
    long got = 0, bad = 0;
    unsigned char buf[8192];
    ssize_t r;
    while ((r = read(c, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < r; i++, got++)
            if (buf[i] != (unsigned char)((got * 7) % 251)) bad++;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "got %ld bytes (%ld wrong) from %s", got, bad, a);
    write_all(c, (const unsigned char *)msg, strlen(msg));
    printf("%s\n", msg);
    close(c);
    return itcp_close(l) == 0 ? 0 : 1;
}

static int accept_result, accept_errno;

static void *blocked_accept(void *arg) {
    int l = *(int *)arg;
    accept_result = itcp_accept(l, NULL, NULL);
    accept_errno = errno;
    return NULL;
}

static int do_listen_close(int port) {
    static int l;
    l = itcp_listen((uint16_t)port);
    if (l < 0) {
        printf("error %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, blocked_accept, &l) != 0) return 1;
    struct timespec half = {0, 500 * 1000 * 1000};
    nanosleep(&half, NULL);
    if (itcp_close(l) != 0) {
        printf("error itcp_close %s\n", errno_name(errno));
        return 1;
    }
    printf("closed\n");
    pthread_join(t, NULL);
    printf("accept returned %d errno %s\n", accept_result, errno_name(accept_errno));
    /* The handle is gone: another itcp_accept on the number is EBADF or EINVAL. */
    if (itcp_accept(l, NULL, NULL) != -1 || (errno != EBADF && errno != EINVAL)) return 1;
    return 0;
}

/* --- mobile: events from the agent --- */

static FILE *evlog;
static volatile int seen[8];

static void on_event(const struct itcp_event *ev, void *user) {
    const char *names[] = {"?", "attached", "moved", "move_failed", "refused",
                           "disconnected", "reconnected", "agent_error"};
    const char *tag = (const char *)user;
    int k = (ev->kind >= 1 && ev->kind <= 7) ? ev->kind : 0;
    fprintf(evlog, "event %s from=%s to=%s connections=%u reason=%s tag=%s\n", names[k],
            ev->from_msr, ev->to_msr, ev->connections, ev->reason, tag);
    fflush(evlog);
    seen[k]++;
}

static int wait_for(int kind, int seconds) {
    struct timespec t = {0, 20 * 1000 * 1000};
    for (int i = 0; i < seconds * 50; i++) {
        if (seen[kind]) return 0;
        nanosleep(&t, NULL);
    }
    return -1;
}

static int do_mobile(const char *log, const char *host, int port, long nbytes) {
    evlog = fopen(log, "w");
    if (!evlog) return 1;
    setvbuf(evlog, NULL, _IOLBF, 0);
    static char tag[] = "demo";
    itcp_set_event_callback(on_event, tag);
    if (itcp_agent_start("air0", "10.2.0.100", "policy=eager,hysteresis_ms=0") != 0) {
        fprintf(evlog, "error agent %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    if (itcp_agent_start("air0", "10.2.0.100", NULL) == 0 || errno != EALREADY) {
        fprintf(evlog, "error second agent start did not fail with EALREADY\n");
        return 1;
    }
    if (wait_for(1, 20) != 0) {
        fprintf(evlog, "error no attached event\n");
        return 1;
    }
    int fd = itcp_connect(host, (uint16_t)port);
    if (fd < 0) {
        fprintf(evlog, "error connect %s %s\n", errno_name(errno), itcp_last_error());
        return 1;
    }
    if (send_pattern(fd, 0, nbytes / 2) != 0) return 1;
    fprintf(evlog, "half sent\n");
    if (wait_for(2, 60) != 0) {
        fprintf(evlog, "error no moved event\n");
        return 1;
    }
    if (send_pattern(fd, nbytes / 2, nbytes) != 0) return 1;
    shutdown(fd, SHUT_WR);
    char ans[256];
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, ans + got, sizeof ans - 1 - got)) > 0) got += (size_t)r;
    ans[got] = 0;
    fprintf(evlog, "answer %s\n", ans);
    close(fd);
    if (wait_for(5, 60) != 0 || wait_for(6, 60) != 0) {
        fprintf(evlog, "error no disconnected/reconnected events\n");
        return 1;
    }
    if (itcp_agent_stop() != 0) return 1;
    fprintf(evlog, "done\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 5 && strcmp(argv[1], "connect") == 0)
        return do_connect(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc >= 4 && strcmp(argv[1], "refused") == 0) return do_refused(argv[2], atoi(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "listen") == 0) return do_listen(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "listen-close") == 0) return do_listen_close(atoi(argv[2]));
    if (argc >= 6 && strcmp(argv[1], "mobile") == 0)
        return do_mobile(argv[2], argv[3], atoi(argv[4]), atol(argv[5]));
    fprintf(stderr, "usage: see the comment at the top of itcp_demo.c (version %s)\n",
            itcp_version());
    return 2;
}
