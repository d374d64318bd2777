package coordinator

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// storeFile is the coordinator's database file inside its data dir.
const storeFile = "coordinator.db"

// Buckets and keys of the coordinator's database.
var (
	bucketMeta       = []byte("meta")       // clusterID, epoch, seqHWM
	bucketPlacements = []byte("placements") // big-endian version → JSON Placement
	bucketShards     = []byte("shards")     // node ID → JSON ShardRecord

	keyClusterID = []byte("cluster_id")
	keyEpoch     = []byte("epoch")
	keySeqHWM    = []byte("seq_hwm")
)

// ErrStoreClosed is returned by Store methods after Close.
var ErrStoreClosed = errors.New("coordinator: store closed")

// Store is the coordinator's persistent state in bbolt: cluster identity,
// epoch, the sequence-ID high-water mark, placement versions and the shard
// registry. Each method is one transaction; none is called on a path a
// request waits on. Methods are safe for concurrent use (bbolt serialises
// writers).
type Store struct {
	db *bolt.DB
}

// StartState is what OpenStore found and wrote at this start.
type StartState struct {
	// ClusterID is created at the first start and kept forever.
	ClusterID string
	// Epoch is this start's epoch: max(persisted + 1, Unix ms), persisted.
	Epoch uint64
	// PrevEpoch is the epoch of the previous start; 0 at the first.
	PrevEpoch uint64
	// SeqHWM is the persisted sequence-ID high-water mark: every ID the
	// previous runs handed out (up to their last reservation) is <= it.
	SeqHWM uint64
}

// ShardRecord is one shard in the registry, keyed by node ID.
type ShardRecord struct {
	NodeID      string    `json:"node_id"`
	ShardID     string    `json:"shard_id"`
	Name        string    `json:"name,omitempty"` // what people call it (shard join --name), shardName-clamped
	Incarnation uint64    `json:"incarnation"`
	GRPCAddr    string    `json:"grpc_addr"`
	Device      string    `json:"device"`
	CPUCores    uint32    `json:"cpu_cores"`
	MemoryBytes uint64    `json:"memory_bytes"`
	KVMemory    uint64    `json:"kv_memory_bytes"`
	Models      []string  `json:"models,omitempty"` // SHA-256 of the model files it has
	Registered  time.Time `json:"registered"`
}

// OpenStore opens (creating) dir/coordinator.db and starts a new epoch:
// max(persisted + 1, now in Unix ms), persisted before it returns.
func OpenStore(dir string, now time.Time) (*Store, StartState, error) {
	var st StartState
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, st, fmt.Errorf("coordinator: data dir: %w", err)
	}
	path := filepath.Join(dir, storeFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, st, fmt.Errorf("coordinator: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketPlacements, bucketShards} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if id := meta.Get(keyClusterID); id != nil {
			st.ClusterID = string(id)
		} else {
			var b [8]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			st.ClusterID = hex.EncodeToString(b[:])
			if err := meta.Put(keyClusterID, []byte(st.ClusterID)); err != nil {
				return err
			}
		}
		st.PrevEpoch = getU64(meta, keyEpoch)
		st.SeqHWM = getU64(meta, keySeqHWM)
		st.Epoch = max(st.PrevEpoch+1, uint64(now.UnixMilli()))
		return putU64(meta, keyEpoch, st.Epoch)
	})
	if err != nil {
		db.Close()
		return nil, st, fmt.Errorf("coordinator: start epoch in %s: %w", path, err)
	}
	return &Store{db: db}, st, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// RaiseSeqHWM persists hwm as the sequence-ID high-water mark if it is
// higher than the stored one.
func (s *Store) RaiseSeqHWM(hwm uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if getU64(meta, keySeqHWM) >= hwm {
			return nil
		}
		return putU64(meta, keySeqHWM, hwm)
	})
}

// SeqHWM returns the persisted sequence-ID high-water mark.
func (s *Store) SeqHWM() (uint64, error) {
	var v uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		v = getU64(tx.Bucket(bucketMeta), keySeqHWM)
		return nil
	})
	return v, err
}

// SavePlacement stores p under its version.
func (s *Store) SavePlacement(p *Placement) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPlacements).Put(u64Key(p.Version), b)
	})
}

// LatestPlacement returns the placement with the highest version, or nil
// when none was ever saved.
func (s *Store) LatestPlacement() (*Placement, error) {
	var p *Placement
	err := s.db.View(func(tx *bolt.Tx) error {
		k, v := tx.Bucket(bucketPlacements).Cursor().Last()
		if k == nil {
			return nil
		}
		p = new(Placement)
		if err := json.Unmarshal(v, p); err != nil {
			return fmt.Errorf("placement %d: %w", binary.BigEndian.Uint64(k), err)
		}
		return nil
	})
	return p, err
}

// PutShard records (replaces) r under its node ID.
func (s *Store) PutShard(r ShardRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketShards).Put([]byte(r.NodeID), b)
	})
}

// DeleteShard removes node ID nodeID's record if it is shard shardID's (a
// newer incarnation's record stays).
func (s *Store) DeleteShard(nodeID, shardID string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketShards)
		v := b.Get([]byte(nodeID))
		if v == nil {
			return nil
		}
		var r ShardRecord
		if err := json.Unmarshal(v, &r); err == nil && r.ShardID != shardID {
			return nil
		}
		return b.Delete([]byte(nodeID))
	})
}

// Shards returns the registry in node-ID order.
func (s *Store) Shards() ([]ShardRecord, error) {
	var out []ShardRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketShards).ForEach(func(k, v []byte) error {
			var r ShardRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("shard %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func u64Key(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b *bolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func putU64(b *bolt.Bucket, k []byte, v uint64) error { return b.Put(k, u64Key(v)) }
