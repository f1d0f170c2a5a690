/* LD_PRELOAD shim for the race: every TCP socket the process opens asks the kernel for the
 * congestion control named by RACE_TCP_CONGESTION, so Open MPI and Gloo can run with the one
 * Monel's TCP links pick (scripts/race.sh --baseline-congestion). A name the kernel refuses
 * leaves the socket as it was. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol) {
    static int (*real)(int, int, int);
    if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    int fd = real(domain, type, protocol);
    const char *cc = getenv("RACE_TCP_CONGESTION");
    if (fd >= 0 && cc && *cc && (domain == AF_INET || domain == AF_INET6) &&
        (type & 0xf) == SOCK_STREAM)
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
    return fd;
}
