#include "results/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "core/common/error.h"

namespace terse::results {
namespace {

struct CtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string hex(const unsigned char* digest, unsigned int len) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

}  // namespace

std::string sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    throw std::runtime_error("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  return hex(digest, len);
}

std::string fileSha256Hex(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TERSE_CHECK(f != nullptr, InvalidArgument, "cannot read " << path.string() << ": " << std::strerror(errno));
  const std::unique_ptr<EVP_MD_CTX, CtxFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed (OpenSSL EVP_DigestInit_ex)");
  std::vector<unsigned char> block(1 << 16);
  std::size_t n = 0;
  while ((n = std::fread(block.data(), 1, block.size(), f.get())) > 0) {
    if (EVP_DigestUpdate(ctx.get(), block.data(), n) != 1)
      throw std::runtime_error("SHA-256 failed (OpenSSL EVP_DigestUpdate)");
  }
  TERSE_CHECK(!std::ferror(f.get()), InvalidArgument, "cannot read " << path.string() << ": " << std::strerror(errno));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len != 32)
    throw std::runtime_error("SHA-256 failed (OpenSSL EVP_DigestFinal_ex)");
  return hex(digest, len);
}

}  // namespace terse::results
