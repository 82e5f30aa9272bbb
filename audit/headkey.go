package audit

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// The .head sidecar anchors the chain's end: a log cut back and given a
// head that names its new last line would verify. Keyed, each head also
// carries an HMAC of its seq and hash under a key derived from capgate's
// token secret, which a tool or anyone without that secret cannot make:
// a rewritten head no longer verifies, and with the key a log must have a
// head. (A head of the same log saved earlier and put back is not told
// apart: it rolls the log back to a point capgate really recorded.)

const headKeyLabel = "capgate audit head v1"

// HeadKey is the key for .head MACs derived from capgate's token secret
// (HKDF-SHA256, its own label); nil for no secret.
func HeadKey(secret []byte) []byte {
	if len(secret) == 0 {
		return nil
	}
	k, err := hkdf.Key(sha256.New, secret, nil, headKeyLabel, 32)
	if err != nil {
		panic("audit: hkdf: " + err.Error()) // only for a length over 255*32
	}
	return k
}

// headMAC is the hex MAC of a head's seq and hash under key.
func headMAC(key []byte, seq uint64, hash string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(headKeyLabel + "\n" + strconv.FormatUint(seq, 10) + "\n" + hash))
	return hex.EncodeToString(m.Sum(nil))
}

// checkMAC says what is wrong with h under key: nothing, a missing MAC or
// one that does not verify.
func (h head) checkMAC(key []byte, name string) error {
	switch {
	case h.mac == "":
		return fmt.Errorf("%s has no MAC: it was written without capgate's key, or rewritten and stripped of it", name)
	case !hmac.Equal([]byte(h.mac), []byte(headMAC(key, h.seq, h.hash))):
		return fmt.Errorf("%s's MAC does not verify under capgate's key: it was rewritten (by someone without the key, or with another one)", name)
	}
	return nil
}
