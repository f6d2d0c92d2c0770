// A raw TCP connection to a server on loopback, for requests no HTTP client would send (tests only).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>

struct RawConn {
  int fd = -1;
  explicit RawConn(int port, int recv_timeout_s = 10) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (sockaddr*)&a, sizeof a) != 0) {
      close(fd);
      fd = -1;
    }
    timeval tv{recv_timeout_s, 0};
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawConn() {
    if (fd >= 0) close(fd);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  bool send_all(std::string_view d) {
    while (!d.empty()) {
      const ssize_t n = ::send(fd, d.data(), d.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      d.remove_prefix((size_t)n);
    }
    return true;
  }
  // Everything until the server closes the connection (or the receive timeout passes); head_only: until the
  // end of the response's head.
  std::string read_all(bool head_only = false) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((!head_only || out.find("\r\n\r\n") == std::string::npos) && (n = read(fd, buf, sizeof buf)) > 0)
      out.append(buf, (size_t)n);
    return out;
  }
};
