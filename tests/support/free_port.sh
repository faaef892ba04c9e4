# Sourced by the test scripts that start `ember launch`: tests run side by side, so the default
# port 29500 may be held by another test's rendezvous. free_port prints a port the kernel just
# handed out and released, which no other test has been given.
free_port() {
  /usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
