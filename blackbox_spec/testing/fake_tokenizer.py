"""The fake target's tokenizer: greedy longest match over UTF-8 bytes.

Its vocabulary is built to trip a text-level client the ways real ones do:
multi-character tokens, whole-character CJK tokens, byte-fallback tokens for
rarer characters and emoji (halves that are not valid UTF-8 alone), and, in
byte-level mode, tokens that cut characters as byte-level BPE ones do.
The client never sees it; only the fake server (:mod:`.fake_target`) does.
"""

from __future__ import annotations

from typing import Iterable

EOS_TEXT = "<|endoftext|>"
OPAQUE_TEXT = "\ufffd"

_WORDS = (
    "the and for with that this from return def class self import None True False "
    "value values result data name names item items list dict print if else elif "
    "while in is not or of to a an be it as at by on we you they he she new old "
    "function var let const type int str float bool json key keys index count "
    "text line lines file files user users id ids error errors http server client "
    "model token tokens draft target accept reject speed fast slow "
).split()
_PIECES = [
    "ing", "ed", "er", "es", "ly", "tion", "():", "()", "(self", "self.", "):", " = ",
    " == ", " += ", "->", "\n", "\n\n", "  ", "    ", "        ", "\n    ", "\n        ",
    '"', "'", ", ", ". ", ": ", "{", "}", "[", "]", "},", "],", '": ', '",', "#", "# ",
    "，", "。", "、",
]
# Whole-token CJK characters; others fall back to UTF-8 byte tokens.
_CJK = "你好世界的是在不了有我这个人们中大来上国和说到时要就出会可也对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官火断精满支视消越器容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历首医局突专费号尽另周较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敌致陈律足态护七兴派孩验责营星够章音跟志底站严巴例防族供效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围江织害斗双境客纪采举杀攻父苏密低朝友诉止细愿千值仍男钱破网热助倒育属坐帝限船脸职速刻乐否刚威毛状率甚独球般普怕弹校苦创假久错承印晚兰试股拿脑预谁益阳若哪微尼继送急血惊伤素药适波夜省初喜卫源食险待述陆习置居劳财环排福纳欢雷警获模充负云停木游龙树疑层冷洲冲射略范竟句室异激汉村哈策演简卡罪判担州静退既衣您宗积余痛检差富灵协角占配征修皮挥胜降阶审沉坚善妈刘读啊超免压银买皇养伊怀执副乱抗犯追帮宣佛岁航优怪香著田铁控税左右份穿艺背阵草脚概恶块顿敢守酒岛托央户烈洋哥索胡款靠评版宝座释景顾弟登货互付伯慢欧换闻危忙核暗姐介坏讨丽良序升监临亮露永呼味野架域沙掉括舰鱼杂误湾吉减编楚肯测败屋跑梦散温困剑渐封救贵枪缺楼县尚毫移娘朋画班智亦耳恩短掌恐遗固席松秘谢鲁遇康虑幸均销钟诗藏赶剧票损忽巨炮旧端探湖录叶春乡附吸予礼港雨呀板庭妇归睛饭额含顺输摇招婚脱补谓督毒油疗旅泽材灭逐莫笔亡鲜词圣择寻厂睡博勒烟授诺伦岸奥唐卖俄炸载洛健堂旁宫喝借君禁阴园谋宋避抓荣姑孙逃牙束跳顶玉镇雪午练迫爷篇肉嘴馆遍凡础洞卷坦牛宁纸诸训私庄祖丝翻暴森塔默握戏隐熟骨访弱蒙歌店鬼软典欲萨伙遭盘爸扩盖弄雄稳忘亿刺拥徒姆杨齐赛趣曲刀床迎冰虎玩析窗醒妻透购替塞努休虎扬途侵刑绿兄迅套贸毕唯谷轮库迹尤竞街促延震弃甲伟麻川申缓潜闪售灯针哲络抵朱埃抱鼓植纯夏忍页杰筑折郑贝尊吴秀混臣雅振染盛怒舞圆搞狂措姓残秋培迷诚宽宇猛摆梅毁伸摩盟末乃悲拍丁赵硬麦蒋操耶阻订彩抽赞魔纷沿喊违妹浪汇币丰蓝殊献桌啦瓦莱援译夺汽烧距裁偏符勇触课敬哭懂墙袭召罚侠厅拜巧侧韩冒债曼融惯享戴童犹乘挂奖绍厚纵障讯涉彻刊丈爆乌役描洗玛患妙镜唱烦签仙彼弗症仿倾牌陷鸟轰咱菜闭奋庆撤泪茶疾缘播朗杜奶季丹狗尾仪偷奔珠虫驻孔宜艾桥淡翼恨繁寒伴叹旦愈潮粮缩罢聚径恰挑袋灰捕徐珍幕映裂泰隔启尖忠累炎暂估泛荒偿横拒瑞忆孤鼻闹羊呆厉衡胞零穷舍码赫婆魂灾洪腿胆津俗辩胸晓劲贫仁偶辑邦恢赖圈摸仰润堆碰艇稍迟辆废净凶署壁御奉旋冬矿抬蛋晨伏吹鸡倍糊秦盾杯租骑乏隆诊奴摄丧污渡旗甘耐凭扎抢绪粗肩梁幻菲皆碎宙叔岩荡综爬荷悉蒂返井壮薄悄扫敏碍殖详迪矛霍允幅撒剩凯颗骂赏液番箱贴漫酸郎腰舒眉忧浮辛恋餐吓挺励辞艘键伍峰尺昨黎辈贯侦滑券崇扰宪绕趋慈乔阅汗枝拖墨胁插箭腊粉泥氏彭拔骗凤慧媒佩愤扑龄驱惜豪掩兼跃尸肃帕驶堡届欣惠册储飘桑闲惨洁踪勃宾频仇磨递邪撞拟滚奏巡颜剂绩贡疯坡瞧截燃焦殿伪柳锁逼颇昏劝呈搜勤戒驾漂饮曹朵仔柔俩孟腐幼践籍牧凉牲佳娜浓芳稿竹腹跌逻垂遵脉貌柏狱猜怜惑陶兽帐饰贷昌叙躺钢沟寄扶铺邓寿惧询汤盗肥尝匆辉奈扣廷澳嘛董迁凝慰厌脏腾幽怨鞋丢埋泉涌辖躲晋紫艰魏吾慌祝邮吐狠鉴曰械咬邻赤挤弯椅陪割揭韦悟聪雾锋梯猫祥阔誉筹丛牵鸣沈阁穆屈旨袖猎臂蛇贺柱抛鼠瑟戈牢逊迈欺吨琴衰瓶恼燕仲诱狼池疼卢仗冠粒遥吕玄尘冯抚浅敦纠钻晶岂峡苍喷耗凌敲菌赔涂粹扁亏寂煤熊恭湿循暖糖赋抑秩帽哀宿踏烂袁侯抖夹昆肝擦猪炼恒慎搬纽纹玻渔磁铜齿跨押怖漠疲叛遣兹祭醉拳弥斜档稀捷肤疫肿豆削岗晃吞宏癌肚隶履涨耀扭坛拨沃绘伐堪仆郭牺歼墓雇廉契拼惩捉覆刷劫嫌瓜歇雕闷乳串娃缴唤赢莲霸桃妥瘦搭赴岳嘉舱俊址庞耕锐缝悔邀玲惟斥宅添挖呵讼氧浩羽斤酷掠妖祸侍乙妨贪挣汪尿莉悬唇翰仓轨枚盐览傅帅庙芬屏寺胖璃愚滴疏萧姿颤丑劣柯寸扔盯辱匹俱辨饿蜂哦腔郁溃谨糟葛苗肠忌溜鸿爵鹏鹰笼丘桂滋聊挡纲肌茨壳痕碗穴膀卓贤卧膜毅锦欠哩函茫昂薛皱夸豫胃舌剥傲拾窝睁携陵哼棉晴铃填饲渴吻扮逆脆喘罩卜炉柴愉绳胎蓄眠竭喂傻慕浑奸扇柜悦拦诞饱乾泡贼亭夕爹酬儒姻卵氛泄杆挨僧蜜吟猩遂狭肖甜霞驳裕顽於摘矮秒卿畜咽披辅勾盆疆赌塑畏吵囊嗯泊肺骤缠冈羞瞪吊贾漏斑涛悠鹿俘锡卑葬铭滩嫁催璇翅盒蛮矣潘歧赐鲍锅廊拆灌勉盲宰佐啥胀扯禧辽抹筒棋裤唉朴咐孕誓喉妄拘链驰栏逝窃艳臭纤玑棵趁匠盈翁愁瞬婴孝颈倘浙谅蔽畅赠妮莎尉冻跪闯葡後厨鸭颠遮谊圳吁仑辟瘤嫂陀框谭亨钦庸歉芝吼甫衫摊宴嘱衷娇陕矩浦讶耸裸碧摧薪淋耻胶屠鹅饥盼脖虹翠崩账萍逢赚撑翔倡绵猴枯巫昭怔渊凑溪蠢禅阐旺寓藤匪伞碑挪琼脂谎慨菩萄狮掘抄岭晕逮砍挽坟悍侨倚娶晰浴郊呕葱咖茂枕嗓庆"
_EMOJI = "😀😃😄😁😆😅😂🙂🙃😉😊😇🥰😍🤩😘😗😚😙😋😛😜🤪😝🤑🤗🤭🤫🤔🤐🤨😐😑😶😏😒🙄😬🤥😌😔😪🤤😴😷🤒🤕🤢🤮🤧🥵🥶🥴😵🤯🤠🥳😎🤓🧐😕😟🙁😮😯😲😳🥺😦😧😨😰😥😢😭😱😖😣😞😓😩😫🥱😤😡😠🤬😈👿💀💩🤡👹👺👻👽👾🤖🎉🚀🔥✨👍👎👋🙏💡📦🐍"


# Byte-level mode: pieces of real byte-level BPE vocabularies that split
# characters in every way a client can trip over.
_PREFIXED = ["th", "the", "ther", "there", "them", "then", " th", " the", " there", "in", "int", "inte", "integer", " in", " int"]
_SPACES = [" ", "  ", "   ", "\t", "\t\t", "\r", "\r\n", "\r\n\r\n", " \n", "\n\n\n", " \r\n", ":\n", ")\n", ".\r\n", "\n\t", "\n  "]
_MARKS = ["e\u0301", "\u0301", "\u0308", "a\u0308", "\u200d", "\ufe0f", "🇫", "🇷", "\u2764\ufe0f"]


def _mixed_pieces() -> list[bytes]:
    """Byte strings that cut characters: a character's tail bytes with whole
    characters after it ("\\xad文本"), whole characters with the next one's
    lead bytes ("中\\xe6"), and emoji pieces with a space."""
    pieces: list[bytes] = []
    chars = "中文本字节测试你好世界。，😀🚀👍🙂"
    for a, b, c in zip(chars, chars[1:], chars[2:]):
        ra, rb, rc = a.encode(), b.encode(), c.encode()
        pieces += [ra[1:] + rb, ra[2:] + rb + rc, ra[-1:] + rb, ra + rb[:1], ra + rb[:2], rb[1:] + rc[:1], ra[1:2]]
    for emoji in "😀🚀👍🙂🎉":
        raw = emoji.encode()
        pieces += [b" " + raw[:2], raw[2:] + b" ", raw[1:3], raw[:3], raw[3:] + b"!"]
    return pieces


def _vocabulary(byte_level: bool = False) -> list[bytes]:
    """Byte tokens 0..255 first (the fallback), then longer tokens."""
    tokens: list[bytes] = [bytes([b]) for b in range(256)]
    extra: list[str] = []
    for word in _WORDS:
        extra += [word, " " + word, word.capitalize(), " " + word.capitalize()]
    extra += _PIECES
    extra += list(_CJK[: len(_CJK) // 2])  # the other half stays byte-split
    if byte_level:
        extra += _PREFIXED + _SPACES + _MARKS
    seen = set(tokens)
    raws = [text.encode() for text in extra] + (_mixed_pieces() if byte_level else [])
    for raw in raws:
        if raw not in seen:
            seen.add(raw)
            tokens.append(raw)
    for emoji in _EMOJI:  # 4-byte emoji: two 2-byte tokens, each invalid UTF-8 alone
        raw = emoji.encode()
        for half in (raw[:2], raw[2:]) if len(raw) == 4 else (raw,):
            if half not in seen:
                seen.add(half)
                tokens.append(half)
    return tokens


class FakeTokenizer:
    """Greedy longest-match tokenizer over UTF-8 bytes, plus one EOS token.

    ``byte_level``: a vocabulary that also cuts characters as byte-level
    BPE ones do (tokens mixing a character's tail bytes with whole
    characters, whole characters with the next one's lead bytes), with
    tokens that are prefixes of others, whitespace-only tokens and tokens
    across newlines and CRLF.
    """

    def __init__(self, byte_level: bool = False) -> None:
        self.byte_level = byte_level
        self.vocab: list[bytes] = _vocabulary(byte_level)
        self.eos_id = len(self.vocab)
        self._ids = {raw: i for i, raw in enumerate(self.vocab)}
        self.max_token_bytes = max(len(raw) for raw in self.vocab)

    def encode(self, text: str) -> list[int]:
        return self.encode_bytes(text.encode())

    def encode_bytes(self, data: bytes) -> list[int]:
        ids, pos, n = [], 0, len(data)
        while pos < n:
            for length in range(min(self.max_token_bytes, n - pos), 0, -1):
                token = self._ids.get(data[pos : pos + length])
                if token is not None:
                    ids.append(token)
                    pos += length
                    break
        return ids

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == self.eos_id else self.vocab[token]

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """How vLLM shows one token in logprobs."""
        if token == self.eos_id:
            return EOS_TEXT
        try:
            return self.vocab[token].decode("utf-8")
        except UnicodeDecodeError:
            return OPAQUE_TEXT
