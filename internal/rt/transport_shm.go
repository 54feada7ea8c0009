package rt

// The shared-memory transport between processes of one host and user.
import _ "github.com/gouct/gouct/uct/shm"
