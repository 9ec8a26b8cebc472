// sluice/store/serving_peer.h: marking the reads a daemon makes for another node.
//
// While a ServingPeer is alive, the calling thread serves another node's request (sluiced
// answering a peer's chunk request). Stores that care ask active():
// - peer::PeerStore never sends such a read on to another peer, so daemons that disagree
//   on the membership cannot bounce a chunk around;
// - cache::TieredCache does not count it as a read of this node's declared order (it
//   neither settles a prefetch nor passes declared chunks).
// Scopes nest; the flag is per thread.
#pragma once

namespace sluice::store {

class ServingPeer {
 public:
  ServingPeer() : previous_(flag()) { flag() = true; }
  ~ServingPeer() { flag() = previous_; }
  ServingPeer(const ServingPeer&) = delete;
  ServingPeer& operator=(const ServingPeer&) = delete;
  static bool active() { return flag(); }

 private:
  static bool& flag() {
    thread_local bool serving = false;  // one per thread, for every translation unit
    return serving;
  }
  bool previous_;
};

}  // namespace sluice::store
