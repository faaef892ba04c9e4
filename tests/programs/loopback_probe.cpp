// Prints how the rendezvous sees each host name on its command line, one line per name:
//
//   NAME loopback=1 everywhere=0 addresses=127.0.1.1 bind_one_machine=NAME bind_two_machines=0.0.0.0 listeners=1
//
// loopback / everywhere: net::is_loopback_host / net::is_loopback_everywhere; addresses: what
// the name resolves to; bind_*: store_bind_address for a job on one machine and on two;
// listeners: how many sockets a store listening on the name opens ("error: ..." if none).
// Tests run it where /etc/hosts is replaced (a private mount namespace) to see names resolve
// as on other machines.
#include <cstdio>
#include <string>

#include "core/error.h"
#include "distributed/rendezvous.h"
#include "distributed/socket_util.h"

using namespace ember::distributed;

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    std::string addresses;
    for (const std::string& a : net::resolve_addresses(name)) addresses += (addresses.empty() ? "" : ",") + a;
    RendezvousInfo one;
    one.master_addr = name;
    one.world_size = one.local_world_size = 2;
    RendezvousInfo two = one;
    two.world_size = 4;
    std::string listeners;
    try {
      listeners = std::to_string(net::listen_on(name, 0).size());
    } catch (const ember::Error& e) {
      listeners = std::string("error: ") + e.what();
    }
    std::printf("%s loopback=%d everywhere=%d addresses=%s bind_one_machine=%s bind_two_machines=%s listeners=%s\n",
                name.c_str(), int(net::is_loopback_host(name)), int(net::is_loopback_everywhere(name)),
                addresses.empty() ? "-" : addresses.c_str(), store_bind_address(one).c_str(),
                store_bind_address(two).c_str(), listeners.c_str());
  }
  return 0;
}
